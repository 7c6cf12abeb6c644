"""The AMD price data reads as a price table and prices AMD GPUs by instance type, else by model."""

from __future__ import annotations

from pathlib import Path

import yaml

from services.billing.price_table import read, resolve

TABLE = Path(__file__).resolve().parents[2] / "data/prices/amd-instinct.yaml"


def test_amd_list_prices_resolve_by_instance_type_then_model() -> None:
    currency, prices = read(yaml.safe_load(TABLE.read_text()))
    by = {(p.scope, p.name): p.per_gpu_hour for p in prices}
    assert currency == "USD"
    instance = {n: v for (s, n), v in by.items() if s == "instance_type"}
    model = {n: v for (s, n), v in by.items() if s == "gpu_model"}
    assert instance == {"Standard_ND96isr_MI300X_v5": 6.0, "BM.GPU.MI300X.8": 6.0}
    kw = {"instance_prices": instance, "cluster_prices": {}, "model_prices": model}
    assert resolve("BM.GPU.MI300X.8", "oci", "MI300X-192GB", **kw) == 6.0
    assert resolve(None, "lab", "MI300X-192GB", **kw) == 1.85
    assert resolve(None, "lab", "MI325X-256GB", **kw) == 1.95
    assert resolve(None, "lab", "MI355X-288GB", **kw) is None  # no public figure: unpriced, not guessed
