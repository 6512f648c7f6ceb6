"""The GPU's clocks, power, temperature and throttle reasons right now, read with nvidia-smi beside a measurement.

A GPU-bound stage runs at the speed its clocks allow, and the clocks move: an H200 at its 700 W cap ran its SM
clock at 1,620-1,860 MHz during long prefills instead of 1,980 (docs/accuracy.md), and a held-out run's first
point measured 28% slower at its end than at its start, which a second machine running the same points in the
same order did not reproduce. A measurement that records the clocks it ran at says which of the two it was:
every measured point keeps this state before its first timed repeat and after its last, and the order check
keeps it beside its repeat of the first point.

Read with `nvidia-smi --query-gpu` (no Python binding needed; about 20-50 ms, outside every timed region). On a
CPU, or where nvidia-smi is missing or fails, there is no state: None, and nothing is faked. torch is imported only
to read a state: the pages that show recorded states run without it.
"""
from __future__ import annotations

import subprocess
from typing import Any, Mapping

FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
# newer drivers name the reasons clocks_event_reasons (the old name still answers on 580); asked when it does not
RENAMED = {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}
KEYS = ("sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "throttle_mask")
# nvidia-smi's clocks event (throttle) reasons, by bit; idle is the GPU waiting for work, not a slowdown
THROTTLE_REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
                    0x10: "sync boost", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                    0x80: "hardware power brake", 0x100: "display clocks"}
SLOWDOWNS = tuple(name for bit, name in THROTTLE_REASONS.items() if bit not in (0x1, 0x2, 0x100))
TIMEOUT_S = 5.0


def parse(line: str) -> dict[str, Any] | None:
    """One `--format=csv,noheader,nounits` line of FIELDS -> the state; None when it does not parse."""
    cells = [c.strip() for c in line.strip().split(",")]
    if len(cells) != len(FIELDS):
        return None
    state: dict[str, Any] = {}
    for key, cell in zip(KEYS, cells):
        try:
            state[key] = int(cell, 16) if key == "throttle_mask" else float(cell)
        except ValueError:  # "[N/A]" or "[Not Supported]": that field is unknown
            state[key] = None
    mask = state["throttle_mask"]
    state["throttle"] = [] if mask is None else [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    return state


def _smi_target(device) -> str:
    """The GPU as nvidia-smi names it: its PCI bus id (CUDA_VISIBLE_DEVICES renumbers torch's indices)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    return str(index)


def read(device) -> dict[str, Any] | None:
    """The GPU's state now ({sm_clock_mhz, mem_clock_mhz, power_w, temperature_c, throttle_mask, throttle}) of
    `device` (torch.device or str), or None on a CPU or where nvidia-smi cannot tell."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    target = _smi_target(device)
    for fields in (FIELDS, tuple(RENAMED.get(f, f) for f in FIELDS)):
        try:
            done = subprocess.run(["nvidia-smi", "-i", target, f"--query-gpu={','.join(fields)}",
                                   "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode == 0 and done.stdout.strip():
            return parse(done.stdout.strip().splitlines()[0])
    return None


def span(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict | None:
    """What a measurement stores: {before, after} (its first and last reading), or None where neither was read."""
    return {"before": before, "after": after} if before or after else None


def slowdowns(state: Mapping[str, Any] | None) -> list[str]:
    """The throttle reasons of a state that slow the GPU down (not idle, not a clock setting)."""
    return [r for r in (state or {}).get("throttle", []) if r in SLOWDOWNS]


def describe(state: Mapping[str, Any] | None, start_clock_mhz: float | None = None) -> str:
    """'SM 1,980 MHz, 412 W, 41 C' (+ ', slowed by software power cap'), or 'GPU state unknown'; with the SM clock
    an earlier reading had, 'SM 1,980 -> 1,935 MHz, ...'."""
    if not state:
        return "GPU state unknown"
    parts = []
    if state.get("sm_clock_mhz") is not None:
        start = f"{start_clock_mhz:,.0f} -> " if start_clock_mhz is not None else ""
        parts.append(f"SM {start}{state['sm_clock_mhz']:,.0f} MHz")
    if state.get("power_w") is not None:
        parts.append(f"{state['power_w']:.0f} W")
    if state.get("temperature_c") is not None:
        parts.append(f"{state['temperature_c']:.0f} C")
    slow = slowdowns(state)
    if slow:
        parts.append("slowed by " + " and ".join(slow))
    return ", ".join(parts) or "GPU state unknown"


def point_text(recorded: Mapping[str, Any] | None) -> str | None:
    """One line of a point's recorded {before, after} states for tables: the SM clock at the start and the end of
    its timed repeats, then the end's power, temperature and slowdowns, e.g. 'SM 1,980 -> 1,935 MHz, 599 W, 53 C,
    slowed by software power cap'. None where nothing was recorded (a CPU, or a point measured before)."""
    if not recorded:
        return None
    before, after = recorded.get("before"), recorded.get("after")
    end = after or before
    if not end:
        return None
    return describe(end, (before or {}).get("sm_clock_mhz") if after else None)
