"""Benchmark harness: cocktailer against its peers on the model zoo.

    python -m bench --quick
    python -m bench --models lstm,rae --batch 1,64 --systems eager,jax,cocktailer:reference

One process runs every system on the same inputs; each result is checked against PyTorch
eager before it is timed. Results go to bench/results/<run-name>/: results.json (machine,
versions, commit, raw timings), table.md, fig14.png and fig_traced.png.
"""
