"""The project the eval's agent works on: a small inventory service with a bug, its tests, and a log.

Made fresh in a temp dir for every run, from a fixed seed, so every run sees the same bytes.
`logs/app.log` is over 30,000 characters: reading it gives a tool output far past the proxy's
truncation limit, and the facts asked about later (the last ERROR's order id) sit past the
preview, where only `read_tool_output` reaches them.
"""

from __future__ import annotations

import random
from pathlib import Path

SEED = 4821
TICKET = "INV-4821"
LAST_ERROR_ORDER = "ORD-77812"
MOST_COMMON_ERROR = "stock would go negative"

README = f"""# inventory-service

Keeps stock levels per SKU for the order pipeline. Orders reserve stock when they are placed and
release it when they are cancelled. Prices are computed in `inventory/pricing.py`.

Open ticket: {TICKET} (stock sometimes goes negative under load).

Run the tests with `python3 -m unittest discover -s tests`.
"""

STOCK = '''"""Stock levels of the inventory service."""


class Stock:
    def __init__(self) -> None:
        self._levels: dict[str, int] = {}

    def add(self, sku: str, quantity: int) -> None:
        self._levels[sku] = self._levels.get(sku, 0) + quantity

    def level(self, sku: str) -> int:
        return self._levels.get(sku, 0)

    def reserve(self, sku: str, quantity: int) -> None:
        self._levels[sku] = self.level(sku) - quantity

    def release(self, sku: str, quantity: int) -> None:
        self._levels[sku] = self.level(sku) + quantity

    def low_stock(self, threshold: int = 5) -> list[str]:
        return sorted(sku for sku, n in self._levels.items() if n < threshold)
'''

PRICING = '''"""Prices of order lines, in cents."""

VAT_PERCENT = 20


def line_price(unit_cents: int, quantity: int) -> int:
    return unit_cents * quantity


def with_vat(cents: int) -> int:
    return int(cents * (100 + VAT_PERCENT) / 100)
'''

TESTS = '''import unittest

from inventory.stock import Stock


class StockTest(unittest.TestCase):
    def test_add(self):
        stock = Stock()
        stock.add("SKU-0001", 3)
        self.assertEqual(stock.level("SKU-0001"), 3)

    def test_reserve(self):
        stock = Stock()
        stock.add("SKU-0001", 3)
        stock.reserve("SKU-0001", 2)
        self.assertEqual(stock.level("SKU-0001"), 1)

    def test_reserve_more_than_available(self):
        stock = Stock()
        stock.add("SKU-0001", 2)
        with self.assertRaises(ValueError):
            stock.reserve("SKU-0001", 5)
        self.assertEqual(stock.level("SKU-0001"), 2)

    def test_low_stock(self):
        stock = Stock()
        stock.add("SKU-0001", 2)
        stock.add("SKU-0002", 9)
        self.assertEqual(stock.low_stock(), ["SKU-0001"])


if __name__ == "__main__":
    unittest.main()
'''

ERRORS = (MOST_COMMON_ERROR, MOST_COMMON_ERROR, MOST_COMMON_ERROR, "payment gateway timeout", "db connection reset")


def app_log(rng: random.Random, lines: int = 420) -> str:
    out = []
    for i in range(lines):
        clock = f"2025-03-14 {9 + i // 60:02d}:{i % 60:02d}:{rng.randrange(60):02d}.{rng.randrange(1000):03d}"
        worker = f"worker-{rng.randrange(1, 5)}"
        order = f"ORD-{rng.randrange(10000, 70000)}"
        sku = f"SKU-{rng.randrange(1, 60):04d}"
        roll = rng.random()
        if roll < 0.12:
            error = rng.choice(ERRORS)
            out.append(f"{clock} ERROR [{worker}] order={order} reserve failed: {error} (sku={sku})")
        elif roll < 0.25:
            out.append(f"{clock} WARN  [{worker}] slow query {rng.randrange(300, 2000)} ms on table stock (sku={sku})")
        else:
            out.append(f"{clock} INFO  [{worker}] order={order} reserved {rng.randrange(1, 9)} x {sku}")
    out.append(f"2025-03-14 16:02:11.907 ERROR [worker-2] order={LAST_ERROR_ORDER} reserve failed: "
               f"{MOST_COMMON_ERROR} (sku=SKU-0017)")
    out.extend(f"2025-03-14 16:02:{12 + i:02d}.000 INFO  [worker-1] heartbeat ok" for i in range(3))
    return "\n".join(out) + "\n"


def orders_csv(rng: random.Random, rows: int = 150) -> str:
    statuses = ("placed", "shipped", "shipped", "cancelled", "delivered")
    lines = ["order_id,sku,quantity,status"]
    lines += [f"ORD-{rng.randrange(10000, 70000)},SKU-{rng.randrange(1, 60):04d},{rng.randrange(1, 9)},{rng.choice(statuses)}"
              for _ in range(rows)]
    return "\n".join(lines) + "\n"


def make_workspace(root: Path) -> Path:
    """Write the project into `root` (created) and return it."""
    rng = random.Random(SEED)
    files = {
        "README.md": README,
        "inventory/__init__.py": "",
        "inventory/stock.py": STOCK,
        "inventory/pricing.py": PRICING,
        "tests/__init__.py": "",
        "tests/test_stock.py": TESTS,
        "logs/app.log": app_log(rng),
        "data/orders.csv": orders_csv(rng),
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
