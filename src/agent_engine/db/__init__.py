"""Database layer: SQLAlchemy models, engine factory and queries grouped by aggregate."""
