"""scache online path: embed, search, decide, and stream every decision."""
