"""One module per op: its fake kernel, autograd formula and Python front door."""
