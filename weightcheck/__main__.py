from weightcheck.launch import main

main()
