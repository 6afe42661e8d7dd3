"""Fast paths behind addnorm.functional: ``cpu`` (the C kernel library) and ``torch`` (exact fallback)."""
