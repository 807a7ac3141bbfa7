"""The run directory: writing it, reading it back (untrusted, live), its tables of metrics."""
