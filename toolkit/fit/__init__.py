"""`pdlab fit`: iteration-time models fitted per node from DuckDB (paper 000 §5.1)."""
