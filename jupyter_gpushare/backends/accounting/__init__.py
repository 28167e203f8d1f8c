"""The accounting: what each kernel, user and group reserved and used, kept in the node ledger's
file by the triggers of :mod:`.schema` and folded into figures by :mod:`.store`."""

from jupyter_gpushare.backends.accounting.schema import create
from jupyter_gpushare.backends.accounting.store import Activity, Keeping

__all__ = ["Activity", "Keeping", "create"]
