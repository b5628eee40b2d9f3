from weightcheck.launch import console_main

console_main()
