"""Scale-out over Ray: measured sweeps and dataset runs spread over every GPU of a node or of a cluster.

One Ray actor per GPU (`num_gpus=1`; on the CPU `num_cpus=1`, for tests), each holding one loaded Session built
from the same load arguments (either session mode). An actor measures one work item at a time by calling the
single-process functions (`sweep.measure_point`, `dataset_run.measure_page`): nothing is measured differently.
The driver alone owns the run store: it feeds items to the workers (a bounded number in flight per worker, the
least loaded first), waits on whatever finishes (`ray.wait`) and writes each result as it arrives.

Failures: an exception inside a measurement is a status recorded by the worker (`oom` / `error` through
`sweep.failure`, as in one process); a worker that dies (RayActorError, WorkerCrashedError) is dropped and each of
its items is retried once on another worker, else recorded as `error` with the message; the run goes on while a
worker is alive. Each death, retry and item lost is said (`WorkerPool.events`, and the pool's `log` as it happens),
and the driver's counts tell the commands how many items were lost for lack of a worker (they exit non-zero).
Resume skips finished keys. A stop (`should_stop`, polled about every 0.2 s) cancels the queued items and stores
the ones already running; Ctrl-C cancels everything, kills the workers and keeps what is stored.

Where: every point's `extra` holds `node` (host name), `node_id` (Ray node id), `gpu_index` (the Ray GPU id),
`gpu_name` (None on the CPU) and `worker`; a pool whose GPUs are of different models is refused unless
`allow_mixed_gpus`, because their timings would not be comparable.

Ray is imported here only, and only when a pool is started: without --workers / --ray-address nothing imports it.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..registry import OfFamily

DEFAULT_IN_FLIGHT = 2  # per worker: the item running and the next one queued, so a GPU never waits on the driver
POLL_S = 0.2
WHERE_KEYS = ("node", "node_id", "gpu_index", "gpu_name", "worker")


class ScaleOutError(ValueError):
    """A scale-out request that cannot be served (no Ray, bad worker count, unreachable address, mixed GPUs)."""


def _ray():
    try:
        import ray
    except ImportError:
        raise ScaleOutError("--workers / --ray-address need Ray: pip install 'ray>=2.40'") from None
    return ray


def check_workers(workers) -> int | None:
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ScaleOutError(f"--workers must be a whole number of at least 1, got {workers!r}")
    return workers


def check_address(address: str, timeout_s: float = 3.0) -> str:
    """'auto' or HOST:PORT (optionally ray://HOST:PORT) of a reachable Ray head; ScaleOutError otherwise (the
    port is probed first, so an unreachable address fails in seconds rather than in Ray's minute-long retries)."""
    address = str(address).strip()
    if address == "auto":
        return address
    m = re.fullmatch(r"(?:ray://)?(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", address)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ScaleOutError(f"--ray-address must be 'auto' or HOST:PORT (e.g. 10.0.0.5:6379), got {address!r}")
    host, port = m.group(1).strip("[]"), int(m.group(2))
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise ScaleOutError(f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}); start one with "
                            "`ray start --head` there, or check the address") from None
    return address


def check_same_gpus(infos: Sequence[dict], allow_mixed: bool = False) -> None:
    """Refuse workers on different GPU models (their timings would not be comparable) unless `allow_mixed`."""
    names: dict[str, int] = {}
    for info in infos:
        label = info.get("gpu_name") or "cpu"
        names[label] = names.get(label, 0) + 1
    if len(names) > 1 and not allow_mixed:
        found = ", ".join(f"{n} x {name}" for name, n in sorted(names.items()))
        raise ScaleOutError(f"the workers have different GPU models ({found}); their timings would not be comparable. "
                            "Pass --allow-mixed-gpus to run anyway")


# ---------------------------------------------------------------------------------------------- the worker
@dataclass(frozen=True)
class WorkItem:
    """A sweep point ('point': payload = Workload) or a page ('page': payload = Sample); `params` holds the run's
    settings (repeats, warmup, seed for points; the ProfileSettings for pages)."""

    kind: str
    key: str
    payload: Any
    params: Any


class Worker:
    """The actor's class (wrapped with ray.remote when a pool starts): one Session, one item at a time."""

    def __init__(self, index: int):
        self.index = index
        self.session = None
        self._page_state: tuple | None = None  # (settings, FlopCache, warmed shapes) of the current dataset run

    def where(self, device: str) -> dict:
        """Node, GPU index and GPU name of this worker (cheap: before the model loads)."""
        import ray
        import torch

        gpu_ids = ray.get_gpu_ids()
        cuda = device != "cpu" and torch.cuda.is_available()
        return {"node": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_index": (str(gpu_ids[0]) if gpu_ids else None) if cuda else None,
                "gpu_name": torch.cuda.get_device_name(0) if cuda else None, "worker": self.index,
                "pid": os.getpid()}

    def load(self, load_args: dict) -> dict:
        """Load the session; return what the driver needs to record the run (as a single process would)."""
        from ..runtime.session import Session
        from .environment import capture_environment

        self.session = Session.load(**load_args)
        s = self.session
        return {"weights": dict(s.weights), "dtype": s.dtype, "attn_impl": s.attn_impl,
                "session_mode": s.session_mode, "device": str(s.device), "spec": s.spec,
                "describe": s.describe(), "environment": capture_environment(str(s.device)),
                **self.where(str(s.device))}

    def calibrate(self, device: str, options: dict) -> dict:
        """A calibration profile of this worker's GPU (no model is loaded): the profile's dict plus where."""
        from ..calibration.microbench import run_microbench

        prof = run_microbench(device, **options)
        return {"profile": prof.to_dict(), **self.where(device)}

    def measure(self, item: WorkItem) -> dict:
        """One item -> {status, message, stages, kv_bytes, resolved, extra, worker_s}. Exceptions become statuses
        (sweep.failure), exactly as the single-process loops record them."""
        t0 = time.perf_counter()
        out = self._point(item) if item.kind == "point" else self._page(item)
        out["worker_s"] = time.perf_counter() - t0
        return out

    def _point(self, item: WorkItem) -> dict:
        from .sweep import failure, free_memory, measure_with_attn, point_extra

        session, workload, p = self.session, item.payload, item.params
        out = {"status": "done", "message": "", "stages": None, "kv_bytes": None, "resolved": None, "extra": {}}
        try:
            result = measure_with_attn(session, workload, p["repeats"], p["warmup"], p["seed"])
            out.update(stages=result.stages, kv_bytes=result.kv_bytes, resolved=result.resolved,
                       extra=point_extra(result))
        except Exception as exc:  # noqa: BLE001 - one bad point must not end the sweep
            out["status"], out["message"] = failure(exc, workload, session.spec.vocab_size)
        if out["status"] != "done":
            free_memory(session.device)
        return out

    def _page(self, item: WorkItem) -> dict:
        from .dataset_run import FlopCache, PageResult, measure_page
        from .sweep import failure, free_memory, older_objects_frozen

        session, sample, settings = self.session, item.payload, item.params
        if self._page_state is None or self._page_state[0] != settings:
            self._page_state = (settings, FlopCache(session, settings.flops), {})
        _, flop_cache, warmed = self._page_state
        try:
            with session.lock:
                with older_objects_frozen():  # one full collection per page; the page's own then stay cheap
                    result = measure_page(session, sample, settings, flop_cache, warmed)
        except Exception as exc:  # noqa: BLE001 - one bad page must not end the run
            status, message = failure(exc)
            result = PageResult(status, message, extra={"page": sample.page.name, "pdf_page": sample.page.pdf_page,
                                                        "epoch": sample.epoch, "label": sample.page.label,
                                                        "source": str(sample.page.path), "failed": "generate"})
        if result.status != "done":
            free_memory(session.device)
        return {"status": result.status, "message": result.message, "stages": result.stages or None,
                "kv_bytes": result.kv_bytes, "resolved": result.resolved or None, "extra": dict(result.extra)}


# ---------------------------------------------------------------------------------------------- the pool
class RemoteSession(OfFamily):
    """What the run-recording code reads from a Session (weights, dtype, attention, mode, device, spec,
    describe()), as reported by the lead worker; the driver loads no model."""

    def __init__(self, info: dict):
        import torch

        self.info = info
        self.weights = info["weights"]
        self.dtype = info["dtype"]
        self.attn_impl = info["attn_impl"]
        self.session_mode = info["session_mode"]
        self.device = torch.device(info["device"])
        self.spec = info["spec"]

    def describe(self) -> dict:
        return dict(self.info["describe"])


@dataclass
class WorkerState:
    index: int
    actor: Any
    where: dict
    alive: bool = True
    done: int = 0
    failed: int = 0
    in_flight: list = field(default_factory=list)  # object refs, oldest (running) first
    current: str = ""
    death: str = ""


class WorkerPool:
    """Ray actors, one per GPU (or CPU slot), each holding one loaded Session. Use `WorkerPool.start(...)` and
    `close()` (or a `with` block)."""

    def __init__(self, workers: list[WorkerState], infos: list[dict], settings: dict, owns_ray: bool,
                 log: Callable[[str], None] | None = None):
        self.workers = workers
        self.infos = infos
        self.settings = settings
        self.owns_ray = owns_ray
        self.log = log
        self.events: list[str] = []  # worker deaths, retries and items lost, in order
        self.lead = RemoteSession(infos[0]) if "weights" in infos[0] else None  # None: no model loaded

    @classmethod
    def start(cls, load_args: dict, workers: int | None = None, address: str | None = None,
              allow_mixed_gpus: bool = False, log: Callable[[str], None] | None = None,
              load: bool = True) -> "WorkerPool":
        """Start (or join, with `address`) Ray, create the actors, refuse mixed GPU models, load the sessions.
        `load_args`: Session.load's keyword arguments (checkpoint, synthetic, seed, device, dtype, attn,
        session_mode, engine_options); with `load=False` (calibration) only `device` is used and no model loads."""
        workers = check_workers(workers)
        if address is None and workers is None:
            raise ScaleOutError("give --workers N (a local Ray instance) or --ray-address (a cluster)")
        if address is not None:
            address = check_address(address)
        ray = _ray()
        import torch

        device = str(load_args.get("device", "auto"))
        load_args = dict(load_args)
        if device.startswith("cuda"):
            load_args["device"] = "cuda"  # each actor sees its one GPU as cuda:0
        owns = False
        if not ray.is_initialized():
            kwargs = dict(include_dashboard=False, logging_level="warning", log_to_driver=False)
            if address is not None:
                try:
                    ray.init(address=address, **kwargs)
                except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
                    raise ScaleOutError(f"cannot join the Ray cluster at {address}: "
                                        f"{str(exc).splitlines()[0][:300]}") from None
            else:
                local_gpus = torch.cuda.device_count() if device != "cpu" else 0
                ray.init(num_cpus=os.cpu_count() or 1, num_gpus=local_gpus, **kwargs)
            owns = True
        try:
            resources = ray.cluster_resources()
            gpus = int(resources.get("GPU", 0))
            use_gpu = device.startswith("cuda") or (device == "auto" and gpus > 0)
            if device.startswith("cuda") and gpus == 0:
                raise ScaleOutError("--device cuda was asked for, but the Ray instance has no GPU")
            slots = gpus if use_gpu else int(resources.get("CPU", 0))
            if workers is None:
                if not use_gpu:
                    raise ScaleOutError("on the CPU give the number of workers (--workers N)")
                workers = gpus
            if workers > slots:
                what = "GPU(s)" if use_gpu else "CPU(s)"
                raise ScaleOutError(f"--workers {workers} asks for more workers than the Ray instance has "
                                    f"{what} ({slots}); one worker per {what[:3]}")
            if not use_gpu:
                load_args["device"] = "cpu"
            options = dict(num_gpus=1, num_cpus=0) if use_gpu else dict(num_cpus=1)
            remote = ray.remote(Worker).options(max_restarts=0, max_task_retries=0, **options)
            actors = [remote.remote(i) for i in range(workers)]
            states = []
            try:
                wheres = ray.get([a.where.remote(load_args["device"]) for a in actors])
                check_same_gpus(wheres, allow_mixed_gpus)
                if log:
                    log(f"{workers} worker(s) on {', '.join(sorted({w['node'] for w in wheres}))}"
                        + ("; loading the model" if load else ""))
                infos = ray.get([a.load.remote(load_args) for a in actors]) if load else wheres
            except BaseException:
                for a in actors:
                    ray.kill(a)
                raise
            states = [WorkerState(i, a, {k: info.get(k) for k in WHERE_KEYS})
                      for i, (a, info) in enumerate(zip(actors, infos))]
        except BaseException:
            if owns:
                ray.shutdown()
            raise
        settings = {"workers": workers, "address": address, "allow_mixed_gpus": allow_mixed_gpus,
                    "resources": "GPU" if use_gpu else "CPU"}
        return cls(states, infos, settings, owns, log)

    # ------------------------------------------------------------------ state
    def alive(self) -> list[WorkerState]:
        return [w for w in self.workers if w.alive]

    def _say(self, line: str) -> None:
        self.events.append(line)
        if self.log:
            self.log(line)

    def describe(self) -> dict:
        """For the run's meta: how the run was spread and where each worker ran."""
        return {**self.settings, "where": [dict(w.where) for w in self.workers]}

    def progress_rows(self) -> list[dict]:
        """One row per worker (for progress displays): where, alive, items done / failed, in flight, current."""
        return [{"worker": w.index, "node": w.where.get("node"), "gpu": w.where.get("gpu_name") or "cpu",
                 "gpu_index": w.where.get("gpu_index"), "alive": w.alive, "done": w.done, "failed": w.failed,
                 "in_flight": len(w.in_flight), "current": w.current, "death": w.death} for w in self.workers]

    def close(self) -> None:
        ray = _ray()
        for w in self.workers:
            if w.alive:
                try:
                    ray.kill(w.actor)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                w.alive = False
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ driving
    def run_items(self, items: Sequence[WorkItem], record: Callable[[WorkItem, dict], None],
                  should_stop: Callable[[], bool] | None = None, in_flight: int = DEFAULT_IN_FLIGHT,
                  on_submit: Callable[[WorkItem, int], None] | None = None) -> dict:
        """Feed `items` to the workers; call `record(item, result)` for each result as it arrives (result: the
        worker's dict plus `where` and `driver_s`, the time from submission to arrival). Returns counts
        {results, retried, lost, stopped, driver_s, worker_s}."""
        ray = _ray()
        from ray.exceptions import RayActorError, TaskCancelledError, WorkerCrashedError

        if in_flight < 1:
            raise ScaleOutError("in_flight must be at least 1")
        pending = deque((item, 0) for item in items)
        flying: dict = {}  # ref -> (item, attempt, worker, submitted at)
        stats = {"results": 0, "retried": 0, "lost": 0, "stopped": 0, "driver_s": 0.0, "worker_s": 0.0}
        stopping = False

        def deliver(item: WorkItem, result: dict, worker: WorkerState | None, t_sub: float) -> None:
            result = dict(result)
            result["where"] = dict(worker.where) if worker is not None else {}
            result["driver_s"] = time.perf_counter() - t_sub
            stats["results"] += 1
            stats["driver_s"] += result["driver_s"]
            stats["worker_s"] += result.get("worker_s", 0.0)
            record(item, result)

        def lost(item: WorkItem, message: str) -> None:
            stats["lost"] += 1
            deliver(item, {"status": "error", "message": message, "stages": None, "kv_bytes": None,
                           "resolved": None, "extra": {}}, None, time.perf_counter())

        try:
            while pending or flying:
                if not stopping and should_stop is not None and should_stop():
                    stopping = True
                    stats["stopped"] = len(pending)
                    pending.clear()
                    for w in self.workers:  # the queued items are cancelled; the running one finishes and is kept
                        for ref in w.in_flight[1:]:
                            ray.cancel(ref)
                while pending:
                    alive = [w for w in self.alive() if len(w.in_flight) < in_flight]
                    if not alive:
                        break
                    worker = min(alive, key=lambda w: (len(w.in_flight), w.index))
                    item, attempt = pending.popleft()
                    ref = worker.actor.measure.remote(item)
                    worker.in_flight.append(ref)
                    flying[ref] = (item, attempt, worker, time.perf_counter())
                    if on_submit:
                        on_submit(item, worker.index)
                if not self.alive():
                    if pending:
                        self._say(f"no Ray worker is left: {len(pending)} item(s) not run, recorded as error")
                    while pending:
                        item, _ = pending.popleft()
                        lost(item, "error: every Ray worker died before this item could run")
                    if not flying:
                        break
                if not flying:
                    continue
                ready, _ = ray.wait(list(flying), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    item, attempt, worker, t_sub = flying.pop(ref)
                    if ref in worker.in_flight:
                        worker.in_flight.remove(ref)
                    try:
                        result = ray.get(ref)
                    except TaskCancelledError:
                        stats["stopped"] += 1
                        continue
                    except (RayActorError, WorkerCrashedError) as exc:
                        name = f"worker {worker.index} on {worker.where.get('node')}"
                        if worker.alive:
                            worker.alive = False
                            worker.death = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                            self._say(f"{name} died ({worker.death}); {len(self.alive())} worker(s) left")
                        message = f"error: {name} died ({type(exc).__name__})"
                        if stopping:
                            stats["stopped"] += 1
                        elif attempt == 0 and self.alive():
                            stats["retried"] += 1
                            pending.appendleft((item, 1))
                            self._say(f"retrying {item_label(item)} (it was on {name}) on another worker")
                        else:
                            why = "it had been retried once already" if attempt else "no other worker left"
                            lost(item, f"{message}; {why}")
                            self._say(f"{item_label(item)} recorded as error: {name} died and {why}")
                        continue
                    except Exception as exc:  # noqa: BLE001 - a failure of the actor method itself (not expected)
                        worker.failed += 1
                        deliver(item, {"status": "error", "stages": None, "kv_bytes": None, "resolved": None,
                                       "extra": {}, "message": f"{type(exc).__name__}: "
                                                               f"{str(exc).splitlines()[0][:500]}"}, worker, t_sub)
                        continue
                    worker.done += result["status"] == "done"
                    worker.failed += result["status"] != "done"
                    deliver(item, result, worker, t_sub)
                for w in self.workers:
                    w.current = ""
                    if w.in_flight:
                        item = flying.get(w.in_flight[0])
                        w.current = item[0].key if item else ""
        except KeyboardInterrupt:  # Ctrl-C: cancel what is queued, kill the workers; what is stored stays
            for ref in flying:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001
                    pass
            self.close()
            raise
        return stats


def item_label(item: WorkItem) -> str:
    """A work item in a few words, for the messages on deaths and retries."""
    if item.kind == "page":
        return f"page {item.payload.label}"
    from .sweep import workload_label

    return f"point {workload_label(item.payload)}"


def calibrate_scaled(pool: WorkerPool, options: dict) -> list[dict]:
    """Every worker calibrates its own GPU at once (run_microbench's options: quick, budget_s, tables, passes); returns
    [{profile (dict), node, gpu_index, gpu_name, worker}] in worker order. A worker that dies is reported as
    {error, node, ...}; the others' profiles are kept. The device is what the pool resolved (a GPU per worker, or
    CPU slots), so --device auto on a machine without a GPU calibrates the CPU."""
    ray = _ray()
    device = "cuda" if pool.settings["resources"] == "GPU" else "cpu"  # each GPU actor sees its one GPU as cuda:0
    refs = [w.actor.calibrate.remote(device, options) for w in pool.workers]
    out = []
    for w, ref in zip(pool.workers, refs):
        try:
            out.append(ray.get(ref))
        except Exception as exc:  # noqa: BLE001 - a dead actor or a failed calibration: keep the others
            out.append({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", **w.where})
    return out


def _pending(finished: set, keyed: list[tuple[str, Any]], kind: str, params, progress) -> list[WorkItem]:
    """The work items of `keyed` ((key, payload) in order) not yet in the store; each finished one is reported to
    `progress` as skipped, in order, as the single-process loops do (resume)."""
    items, skipped = [], 0
    for key, payload in keyed:
        if key in finished:
            skipped += 1
            if progress:
                progress(skipped, len(keyed), payload, "skipped")
        else:
            items.append(WorkItem(kind, key, payload, params))
    return items


def _where_extra(result: dict) -> dict:
    return {k: result["where"].get(k) for k in WHERE_KEYS} if result.get("where") else {}


# ---------------------------------------------------------------------------------------------- sweeps
def run_sweep_scaled(pool: WorkerPool, store, workloads: list, run_id: str | None = None,
                     name: str = "measured sweep", repeats: int = 3, warmup: int = 1, seed: int = 0,
                     progress: Callable | None = None, should_stop: Callable[[], bool] | None = None,
                     meta: dict | None = None, kind: str = "sweep", in_flight: int = DEFAULT_IN_FLIGHT,
                     stats: dict | None = None, order_check: bool = True) -> str:
    """`sweep.run_sweep` over the pool's workers: the same points, keys, statuses and meta, plus where each point
    was measured (`extra`) and the pool (`meta.scale_out`). Returns the run id. `stats` (a dict) receives the
    driver's counts (results, retried, lost, stopped, driver_s, worker_s). The order check is not made (each
    worker measures its own sequence of points); with `order_check` the run's meta says so."""
    from ..results.store import point_key

    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    lead = pool.lead
    if run_id is None:
        run_id = store.create_run(kind, name, lead.info["environment"], lead.weights, dtype=lead.dtype,
                                  attn=lead.attn_impl, session_mode=lead.session_mode,
                                  meta={**(meta or {}), "repeats": repeats, "warmup": warmup, "seed": seed,
                                        "session": lead.describe(), "spec": lead.spec.model_dump(mode="json"),
                                        "scale_out": pool.describe()})
    total = len(workloads)
    params = {"repeats": repeats, "warmup": warmup, "seed": seed}
    items = _pending(store.finished_keys(run_id), [(point_key(w), w) for w in workloads], "point", params, progress)
    handled = total - len(items)

    def record(item: WorkItem, result: dict) -> None:
        nonlocal handled
        extra = {**(result.get("extra") or {}), **_where_extra(result)}
        if result["status"] == "done":
            store.put_point(run_id, item.payload, "done", "", result["stages"], result["kv_bytes"],
                            result["resolved"], extra)
        else:
            store.put_point(run_id, item.payload, result["status"], result["message"], extra=extra)
        handled += 1
        if progress:
            progress(handled, total, item.payload, result["status"])

    out = pool.run_items(items, record, should_stop, in_flight)
    if stats is not None:
        stats.update(out)
    if order_check and items:
        _order_check_skipped(store, run_id)
    return run_id


def _order_check_skipped(store, run_id: str) -> None:
    """Scaled-out runs have no single order to check: each worker measures its own sequence of points."""
    store.update_run(run_id, meta={"order_check": {"skipped": "points spread over workers, each measuring its own "
                                                              "sequence of points"}})


# ---------------------------------------------------------------------------------------------- dataset runs
def run_dataset_scaled(pool: WorkerPool, store, run_id: str, samples: Sequence, settings,
                       progress: Callable | None = None, should_stop: Callable[[], bool] | None = None,
                       in_flight: int = DEFAULT_IN_FLIGHT, stats: dict | None = None,
                       order_check: bool = True) -> dict[str, int]:
    """`dataset_run.run_dataset` over the pool's workers (create the run with `create_dataset_run(store,
    pool.lead, ...)`). Returns counts {done, oom, error, skipped, stopped}. With `order_check` the run's meta says
    why it has none (as run_sweep_scaled)."""
    from ..results.store import point_key

    settings.validate()
    total = len(samples)
    items = _pending(store.finished_keys(run_id), [(point_key(s.key), s) for s in samples], "page", settings,
                     progress)
    handled = total - len(items)
    counts = {"done": 0, "oom": 0, "error": 0, "skipped": handled, "stopped": 0}

    def record(item: WorkItem, result: dict) -> None:
        nonlocal handled
        sample = item.payload
        extra = {"page": sample.page.name, "pdf_page": sample.page.pdf_page, "epoch": sample.epoch,
                 "label": sample.page.label, "source": str(sample.page.path), **(result.get("extra") or {}),
                 **_where_extra(result)}
        store.put_point(run_id, sample.key, result["status"], result["message"], result["stages"],
                        result["kv_bytes"], result["resolved"], extra)
        counts[result["status"]] += 1
        handled += 1
        if progress:
            progress(handled, total, sample, result["status"])

    out = pool.run_items(items, record, should_stop, in_flight)
    counts["stopped"] = out["stopped"]
    if stats is not None:
        stats.update(out)
    if order_check and items:
        _order_check_skipped(store, run_id)
    return counts


# ---------------------------------------------------------------------------------------------- command line
def add_scale_out_options(p) -> None:
    """--workers, --ray-address, --allow-mixed-gpus (measure, profile, calibrate). Parsing them imports nothing."""
    g = p.add_argument_group("scale-out over Ray (optional; without these Ray is not used)")
    g.add_argument("--workers", metavar="N", help="start a local Ray instance with N workers, one per GPU "
                                                  "(on --device cpu: one per CPU core), each holding the model")
    g.add_argument("--ray-address", metavar="auto|HOST:PORT",
                   help="join a running Ray cluster (`ray start --head` / `ray start --address`); workers: --workers "
                        "or one per GPU of the cluster")
    g.add_argument("--allow-mixed-gpus", action="store_true",
                   help="run even if the workers' GPU models differ (their timings are not comparable)")


def scale_out_requested(args) -> bool:
    return getattr(args, "workers", None) is not None or getattr(args, "ray_address", None) is not None


def pool_from_args(args, log: Callable[[str], None] | None = None, load: bool = True) -> WorkerPool:
    """The WorkerPool the model options and the scale-out options describe (ScaleOutError: one line, exit 2).
    load=False (calibrate): the workers load no model; only --device is read."""
    workers = args.workers
    if workers is not None:
        try:
            workers = int(str(workers).strip())
        except ValueError:
            raise ScaleOutError(f"--workers must be a whole number of at least 1, got {args.workers!r}") from None
    if load:
        from ..engines import parse_options

        load_args = dict(checkpoint=args.checkpoint, synthetic=args.synthetic, seed=args.weights_seed,
                         session_mode=args.session_mode, device=args.device, dtype=args.dtype, attn=args.attn,
                         model=getattr(args, "model", None),
                         engine_options=parse_options(getattr(args, "engine_options", None)))
    else:
        load_args = dict(device=args.device)
    return WorkerPool.start(load_args, workers=workers, address=args.ray_address,
                            allow_mixed_gpus=args.allow_mixed_gpus, log=log, load=load)


@contextmanager
def command_pool(args, load: bool = True):
    """The pool a command's scale-out options describe, its start-up and worker lines on stderr, closed after the
    block (measure, profile, calibrate). ScaleOutError: one line, exit 2."""
    pool = pool_from_args(args, log=lambda line: print(line, file=sys.stderr, flush=True), load=load)
    try:
        print(pool_line(pool), file=sys.stderr, flush=True)
        yield pool
    finally:
        pool.close()


def lost_to_dead_workers(stats: dict, run_id: str, what: str = "point") -> int:
    """The exit status of a scaled-out command once its run ended: 1, with a line saying so, when items failed for
    lack of a live worker (their error statuses are stored; a resume retries them); else 0."""
    lost = stats.get("lost", 0)
    if not lost:
        return 0
    print(f"{lost} {what}(s) failed because their Ray workers died (see the lines above); they are stored as "
          f"errors: retry them with --resume {run_id[:12]}", file=sys.stderr, flush=True)
    return 1


def pool_line(pool: WorkerPool) -> str:
    """One line: the workers and where they run."""
    by = {}
    for w in pool.workers:
        label = f"{w.where.get('node')} {w.where.get('gpu_name') or 'cpu'}"
        by[label] = by.get(label, 0) + 1
    return (f"{len(pool.workers)} Ray worker(s) ({pool.settings['resources']}): "
            + "; ".join(f"{n} on {label}" for label, n in by.items()))
