from weightcheck.cli import main

main()
