"""The tour's sections: each a function returning plain data (numbers and arrays) for the report."""
