"""References: the float64 oracle, the pure-Python backend and the NumPy backend. Imports nothing of addnorm."""
