from once.cli import main

main()
