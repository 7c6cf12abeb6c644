"""Billing: GPU-hour prices, cost accrued per team and job per period, idle cost per pool, budgets."""
