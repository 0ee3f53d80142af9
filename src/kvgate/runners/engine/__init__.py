"""What a running engine says (kvgate.runners): its log, its attention layers, its benchmark output. Pure."""
