"""One stage of one cell (kvgate.runners): kernels, accuracy (+ probe), throughput, and the processes they run."""
