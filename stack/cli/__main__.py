from stack.cli.entry import main

main()
