"""Example applications written only against accord's public API (``from accord import ...``)."""
