from quantbench.cli import main

main()
