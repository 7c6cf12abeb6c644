"""A price table file (`chamber billing price import FILE`) read into per-GPU-hour prices, pure.

    currency: USD
    gpu_models:                       # per GPU-hour
      NVIDIA-H100-80GB-HBM3: 2.50
    instance_types:                   # cloud nodes (node.kubernetes.io/instance-type)
      p5.48xlarge: {per_hour: 98.32, gpus: 8}       # the instance's hourly price, shared by its GPUs
      a3-highgpu-8g: {per_gpu_hour: 11.06}
    clusters:                         # on-premises: every GPU of the cluster
      onprem-east: {capex: 3200000, years: 4, opex_per_year: 400000, gpus: 512}   # amortised
      lab: {per_gpu_hour: 0.90}

Amortised rate = (capex / years + opex_per_year) / (gpus x 8,766 hours a year). Billing prices a GPU
by its node's instance type, else its cluster, else its model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

HOURS_PER_YEAR = 8766.0  # 365.25 days


class PriceTableError(ValueError):
    pass


@dataclass(frozen=True)
class Price:
    scope: str  # gpu_model | instance_type | cluster
    name: str
    per_gpu_hour: float
    how: str  # how the figure was derived, for the command's output


def _number(value: Any, where: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PriceTableError(f"{where}: expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise PriceTableError(f"{where}: {value!r} must be {'above' if positive else 'at least'} 0")
    return number


def _entry(scope: str, name: str, value: Any) -> Price:
    where = f"{scope}s.{name}"
    if not isinstance(value, dict):
        return Price(scope, name, _number(value, where), "per GPU-hour")
    keys = set(value)
    if keys == {"per_gpu_hour"}:
        return Price(scope, name, _number(value["per_gpu_hour"], f"{where}.per_gpu_hour"), "per GPU-hour")
    if scope == "instance_type" and keys == {"per_hour", "gpus"}:
        per_hour = _number(value["per_hour"], f"{where}.per_hour")
        gpus = _number(value["gpus"], f"{where}.gpus", positive=True)
        return Price(scope, name, per_hour / gpus, f"{per_hour:g} per hour / {gpus:g} GPUs")
    if scope == "cluster" and {"capex", "years", "gpus"} <= keys <= {"capex", "years", "gpus", "opex_per_year"}:
        capex = _number(value["capex"], f"{where}.capex")
        years = _number(value["years"], f"{where}.years", positive=True)
        gpus = _number(value["gpus"], f"{where}.gpus", positive=True)
        opex = _number(value.get("opex_per_year", 0), f"{where}.opex_per_year")
        rate = (capex / years + opex) / (gpus * HOURS_PER_YEAR)
        return Price(scope, name, rate, f"({capex:g} / {years:g} years + {opex:g} a year) / {gpus:g} GPUs, amortised")
    allowed = {
        "gpu_model": "a number or {per_gpu_hour}",
        "instance_type": "a number, {per_gpu_hour} or {per_hour, gpus}",
        "cluster": "a number, {per_gpu_hour} or {capex, years, gpus[, opex_per_year]}",
    }[scope]
    raise PriceTableError(f"{where}: expected {allowed}, got keys {sorted(keys)}")


def read(table: Any) -> tuple[str, list[Price]]:
    """(currency, prices) from the parsed file; a PriceTableError names the entry at fault."""
    if not isinstance(table, dict):
        raise PriceTableError("expected a mapping with gpu_models, instance_types and/or clusters")
    unknown = set(table) - {"currency", "gpu_models", "instance_types", "clusters"}
    if unknown:
        raise PriceTableError(f"unknown keys {sorted(unknown)}: use currency, gpu_models, instance_types, clusters")
    currency = str(table.get("currency") or "USD")
    prices = []
    for section, scope in (("gpu_models", "gpu_model"), ("instance_types", "instance_type"), ("clusters", "cluster")):
        entries = table.get(section) or {}
        if not isinstance(entries, dict):
            raise PriceTableError(f"{section}: expected a mapping of names to prices")
        for name, value in sorted(entries.items(), key=lambda kv: str(kv[0])):
            prices.append(_entry(scope, str(name), value))
    if not prices:
        raise PriceTableError("no prices: fill gpu_models, instance_types or clusters")
    return currency, prices


def resolve(
    instance_type: str | None,
    cluster: str,
    model: str,
    *,
    instance_prices: Mapping[str, float],
    cluster_prices: Mapping[str, float],
    model_prices: Mapping[str, float],
) -> float | None:
    """The one pricing order (billing, the dashboard's live rates; the warehouse view `gpu_prices` says
    the same in SQL): the node's instance type, else its cluster, else the GPU's model; None: no price."""
    if instance_type is not None and instance_type in instance_prices:
        return instance_prices[instance_type]
    if cluster in cluster_prices:
        return cluster_prices[cluster]
    return model_prices.get(model)
