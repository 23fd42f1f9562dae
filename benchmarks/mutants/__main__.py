from benchmarks.mutants.bench import main

main()
