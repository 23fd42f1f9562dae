from gradprobe.cli import main

main()
