"""The mutation bench: seed bugs into real model sources, keep the observable ones, score gradprobe on them.

    python -m benchmarks.mutants [--limit N] [--only OP[,OP]] [--sources S[,S]] [--json out.json]

See bench.py for the pipeline (materialise sources -> baseline run -> operators -> plain-PyTorch oracle ->
case directories in the bugzoo format -> the real server through MCP -> tables).
"""
