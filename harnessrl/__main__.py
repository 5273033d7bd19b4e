from harnessrl.cli.main import main

main()
