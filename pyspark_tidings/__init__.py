"""Lets Spark find the ``tidings`` format with no ``register()`` call.

When a session first resolves a Python data source, PySpark imports every top-level
module named ``pyspark_*`` it can list on ``sys.path`` and registers its
``DefaultSource`` under ``DefaultSource.name()`` (pyspark/sql/worker/lookup_data_sources.py).
Listing uses :func:`pkgutil.iter_modules`, which sees directories on ``sys.path`` but not
the import hooks of a default (PEP 660) editable install: install normally, or editable
with ``pip install -e . --config-settings editable_mode=compat``.
"""

from tidings.spark.source import TidingsDataSource as DefaultSource

__all__ = ["DefaultSource"]
