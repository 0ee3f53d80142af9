"""The machine and the software an engine runs on (kvgate.runners): stdlib only at import, the noxfile imports it."""
