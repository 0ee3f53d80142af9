"""The gate's check families (kvgate.gate.evaluation runs them): health, accuracy (with pairing), throughput, probe,
kv_cache, waivers; pending (a check whose decision waits for its p-value) and formatting, which they share."""
