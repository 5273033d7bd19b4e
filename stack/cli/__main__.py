from stack.cli.main import main

main()
