#!/usr/bin/env python3
"""The benchmark driver: starts a release `hookd serve` per scenario in a fresh directory, drives
it with wrk (bench/ingest.lua) on loopback, and prints the figures.

Run it through `bench/run.sh`, which builds what it needs first. Scenarios:

  ingest    durable accepts/s and acknowledgement latency (github signature + github Wasm parser,
            ~1.5 KB bodies, 10% duplicates, handlers = [], durability = "full"), with group
            commit and with one commit per request; then fsyncs counted with strace.
  dispatch  end-to-end handled events/s (accept -> done) with the `counter` and the stateless
            `flaky` handler; the drain rate of a stored backlog; resident memory per in-flight
            handler with 1 000 handlers waiting at once.
  retention a steady ingest load (bench/steady.lua: a fixed offered rate) against three hosts in
            turn: retention off (done_after = "forever"), on (done_after = "30s", ids kept
            forever) and on with ids forgotten (dedupe_for = "30s" too); every window (10 s)
            samples the database's size on disk and the ingest latency, so the size over time
            and the p99 with pruning running are side by side. RETENTION_DURATION per host
            (default 600s).
  peer      hookd beside a native receiver (PEER_BIN: axum + rusqlite, Standard Webhooks check,
            INSERT OR IGNORE, group commit, synchronous=FULL) in one run: rounds of PEER_REQUESTS
            signed messages per wrk thread (10% re-sent, 64 connections), the order rotating;
            hookd without parser or handler, and hookd with the `github` parser and one
            delivery row per event; ratios per round, then bytes stored per event.
  cluster   the storage backends side by side in one run: durable accepts/s (as `ingest`) and
            handled events/s (stateless `flaky`, as `dispatch`) on SQLite, on PostgreSQL with
            one node, and with three nodes sharing the database (the load spread over them);
            the server's settings and its WAL flushes per acknowledged request. The database
            is HOOKD_BENCH_POSTGRES_URL (bench/run.sh starts a local server: .ci/postgres.sh --bench);
            each measurement gets a fresh database on it. With HOOKD_BENCH_PGBOUNCER_URL
            (PgBouncer in transaction mode before that server: .ci/pgbouncer.sh), also one node
            through it with `database_pooler = "transaction"`.
  outage    ingest through a downstream outage: the `ingest` load (github parser, ~900 ordering
            keys) on a source whose handler (`flaky`, asked by every body to fail and retry an
            hour later) has every key's head waiting on a retry, against the same source with
            the handler not loaded; OUTAGE_ROUNDS (2) rounds, alternating.

Every host runs in target/bench/<scenario>/ (a real disk: fsyncs cost what they cost) and is
stopped with SIGTERM at the end of its scenario. Nothing here sends traffic off 127.0.0.1.
"""

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
HOOKD = Path(os.environ.get("HOOKD_BIN", ROOT / "target" / "release" / "hookd"))
WASM = ROOT / "target" / "wasm-plugins" / "wasm32-wasip2" / "release"
WORK = ROOT / "target" / "bench"
SECRET = "bench-github-secret"
ADMIN_TOKEN = "bench-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(message: str) -> None:
    print(message, flush=True)


def terminate(proc: subprocess.Popen, pid: int, seconds: float) -> None:
    """Sends SIGTERM to `pid` and waits up to `seconds` for `proc` to exit; kills it after."""
    os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_started(proc: subprocess.Popen, probe, seconds: float, failure: str) -> None:
    """Waits until `probe()` stops raising OSError; gives up with `failure` once `proc` exited
    or `seconds` passed."""
    deadline = time.time() + seconds
    while True:
        try:
            probe()
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(failure)
            time.sleep(0.05)


class Host:
    """A `hookd serve` process in its own directory, optionally under strace."""

    def __init__(self, name: str, server: str, sources: str, plugins: dict, strace: bool = False,
                 database: str = "hookd.db", fresh: bool = True):
        self.dir = WORK / name
        self.sqlite = not database.startswith("postgres")
        if fresh:
            shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "plugins").mkdir(parents=True, exist_ok=True)
        for stem, wasm in plugins.items():
            if wasm is not None:
                source = wasm if isinstance(wasm, Path) else WASM / f"{wasm}.wasm"
                shutil.copy(source, self.dir / "plugins" / f"{stem}.wasm")
        self.port, self.admin_port = free_port(), free_port()
        config = (
            f'[server]\nlisten = "127.0.0.1:{self.port}"\n'
            f'admin_listen = "127.0.0.1:{self.admin_port}"\n'
            f'admin_token = "{ADMIN_TOKEN}"\ndatabase = "{database}"\nplugins_dir = "plugins"\n'
            f"{server}\n{sources}\n"
        )
        (self.dir / "hookd.toml").write_text(config)
        self.strace_out = self.dir / "strace.txt"
        self.strace = strace
        command = [str(HOOKD), "serve", "--config", str(self.dir / "hookd.toml")]
        if strace:
            command = [
                "strace", "-f", "-c", "-e", "trace=fsync,fdatasync",
                "-o", str(self.strace_out),
            ] + command
        self.log = open(self.dir / "hookd.log", "w")
        env = dict(os.environ, HOOKD_LOG=os.environ.get("HOOKD_LOG", "warn"))
        env.pop("HOOKD_DATABASE_URL", None)
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=self.log, env=env)
        wait_started(self.proc, lambda: self.get("/healthz"), 120,
                     f"hookd did not start; see {self.dir / 'hookd.log'}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{self.admin_port}{path}",
                                         headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.read().decode()

    def metrics(self) -> dict:
        values = {}
        for line in self.get("/metrics").splitlines():
            m = re.match(r'^(hookd_\w+)(?:\{state="(\w+)"\})? (\d+)$', line)
            if m:
                values[m.group(2) or m.group(1)] = int(m.group(3))
        return values

    def states(self) -> dict:
        """Deliveries by state, read from the database itself (a WAL reader: it never blocks
        hookd's writer). /metrics samples the finished states only every 10 s, too coarse to
        time a run by."""
        uri = f"file:{self.dir / 'hookd.db'}?mode=ro"
        db = sqlite3.connect(uri, uri=True, timeout=10, isolation_level=None)
        try:
            # One count per state, each a range of the (state, ...) index, all in one read
            # transaction: counted one after another outside it, a delivery that moved on
            # between two counts (pending, then done) was counted twice, and a run waited for
            # more deliveries than were stored.
            db.execute("BEGIN")
            return {state: db.execute("SELECT COUNT(*) FROM deliveries WHERE state = ?",
                                      (state,)).fetchone()[0] for state in STATES}
        finally:
            db.close()

    def rss_kib(self) -> int:
        """Resident set of hookd itself (the strace wrapper is never used for memory)."""
        with open(f"/proc/{self.hookd_pid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def hookd_pid(self) -> int:
        """hookd's own pid: under strace, strace's child."""
        if self.strace:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            return int(children.split()[0])
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Under strace, stop hookd itself: strace then writes its summary and exits.
            terminate(self.proc, self.hookd_pid(), 60)
        self.log.close()

    def count(self, sql: str) -> int:
        with sqlite3.connect(self.dir / "hookd.db") as db:
            return db.execute(sql).fetchone()[0]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        if not os.environ.get("BENCH_KEEP"):
            # Hundreds of MB per scenario; keep hookd.toml and hookd.log for a look afterwards.
            for leftover in self.dir.glob("hookd.db*"):
                leftover.unlink(missing_ok=True)


def wait_quiet(max_wait: float = None, threshold: float = 0.15) -> None:
    """Waits (up to QUIET_WAIT seconds, default 300) until the machine has been idle for 2 s,
    so a figure is not taken while a compiler or a test suite shares the two cores.

    First it writes out every dirty page (`sync`): a corpus just written (the peer scenario's
    is 100 MB a round) is otherwise flushed by the kernel some 30 s later, during whichever
    measurement runs then, and its writeback stalls that receiver's fsyncs (a fresh hookd's
    p99 measured 179-205 ms after writing the corpus, 10-12 ms with a `sync` first). Waiting
    on the disk is not counted as busy, so the wait alone would not see it."""
    os.sync()
    if max_wait is None:
        max_wait = float(os.environ.get("QUIET_WAIT", "300"))
    deadline = time.time() + max_wait
    tick = os.sysconf("SC_CLK_TCK")
    while True:
        before = busy_jiffies()
        time.sleep(2)
        cores = (busy_jiffies() - before) / tick / 2
        if cores <= threshold:
            return
        if time.time() > deadline:
            log(f"        (machine still busy: {cores:.2f} cores used by others; measuring anyway)")
            return


def busy_jiffies() -> int:
    """CPU time used by the whole machine so far (all cores), in clock ticks."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # minus idle and iowait


def stat_ticks(stat: str) -> int:
    """utime + stime of one /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat text."""
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def proc_jiffies(pid: int) -> int:
    return stat_ticks(open(f"/proc/{pid}/stat").read())


def thread_jiffies(pid: int) -> dict:
    """CPU time each thread name of process `pid` used so far (tokio's workers, the writer, the
    checkpointer, ...), in clock ticks."""
    totals = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        name = text[text.index("(") + 1:text.rindex(")")]
        totals[name] = totals.get(name, 0) + stat_ticks(text)
    return totals


def wrk(url: str, script: str, args: list, threads: int, connections: int, duration: str,
        host: "Host | None" = None, quota: int = 0, stop_file: "Path | None" = None,
        env: "dict | None" = None) -> dict:
    """Runs wrk (with `env` added to its environment); with `host`, also reports the CPU hookd,
    wrk and everything else used meanwhile (in cores), so a figure taken while other work shared
    the machine is visible as such, and the receiver's CPU per answered request by thread name
    (in µs), which says where it goes."""
    done_file = stop_file
    if quota:
        done_file = WORK / f"wrk-done-{os.getpid()}-{time.time_ns()}"
        args = list(args) + [quota, done_file]
    command = [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{duration}", "--latency", "--timeout", "10s",
        "-s", str(BENCH / script), url, "--",
    ] + [str(a) for a in args]
    machine0, started = busy_jiffies(), time.time()
    hookd0 = proc_jiffies(host.hookd_pid()) if host else 0
    threads0 = thread_jiffies(host.hookd_pid()) if host else {}
    children0 = os.times()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **(env or {})))
    if done_file is not None:
        # A quota run: wrk would wait out its whole -d; interrupt it once the quota is sent.
        while proc.poll() is None and not done_file.exists():
            time.sleep(0.02)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"wrk failed ({proc.returncode}): {err}")
    elapsed = time.time() - started
    children1 = os.times()
    tick = os.sysconf("SC_CLK_TCK")
    wrk_cores = (children1.children_user + children1.children_system
                 - children0.children_user - children0.children_system) / elapsed
    machine_cores = (busy_jiffies() - machine0) / tick / elapsed
    line = next((l for l in out.splitlines() if l.startswith("BENCH ")), None)
    if line is None:
        raise SystemExit(f"wrk printed no BENCH line:\n{out}")
    result = {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
    result["command"] = " ".join(command)
    if done_file is not None:
        done_file.unlink(missing_ok=True)
    if host:
        hookd_cores = (proc_jiffies(host.hookd_pid()) - hookd0) / tick / elapsed
        result["cpu"] = (
            f"CPU in cores: hookd {hookd_cores:.2f}, wrk {wrk_cores:.2f}, "
            f"other processes {max(machine_cores - hookd_cores - wrk_cores, 0):.2f}"
        )
        answered = max(result["accepted"] + result.get("other", 0), 1)
        per_thread = sorted(((ticks - threads0.get(name, 0)) * 1e6 / tick / answered, name)
                            for name, ticks in thread_jiffies(host.hookd_pid()).items())
        result["cpu"] += "; µs per request: " + ", ".join(
            f"{name} {us:.1f}" for us, name in reversed(per_thread) if us >= 0.1)
    return result


# --- ingest ---------------------------------------------------------------------------------

INGEST_SOURCES = f"""
[sources.github]
scheme = "github"
secrets = ["{SECRET}"]
parser = "github"
handlers = []
"""


def ingest_corpus() -> Path:
    """The ingest corpus (bench/corpus.py: 1 000 signed ~1.5 KB bodies), written anew."""
    corpus = WORK / "corpus.tsv"
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(BENCH / "corpus.py"), str(corpus), "--count", "1000", "--size", "1500",
         "--secret", SECRET],
        check=True,
    )
    return corpus


def ingest(args) -> None:
    corpus = ingest_corpus()
    results = {}
    for mode, group in (("group", "true"), ("per-request", "false")):
        server = f'durability = "full"\ngroup_commit = {group}'
        with Host(f"ingest-{mode}", server, INGEST_SOURCES, {"github": "github"}) as host:
            run_id = f"{mode}-{int(time.time())}"
            wrk(host.url, "ingest.lua", [corpus, f"warm-{run_id}"], args.threads,
                args.connections, args.warmup)
            wait_quiet()
            commits_before = host.metrics().get("hookd_inbox_commits_total", 0)
            r = wrk(host.url, "ingest.lua", [corpus, run_id], args.threads, args.connections,
                    args.duration, host)
            commits = host.metrics().get("hookd_inbox_commits_total", 0) - commits_before
            host.stop()
            stored = host.count(f"SELECT COUNT(*) FROM events WHERE event_id LIKE '{run_id}-%'")
        r["stored_new"] = stored
        r["commits"] = commits
        results[mode] = r
        log(
            f"ingest  group_commit={group:5}  {r['accepted_per_s']:8.0f} accepted/s  "
            f"p50 {r['p50_ms']:.2f} ms  p90 {r['p90_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
            f"max {r['max_ms']:.1f} ms  | {int(r['accepted'])} x 202 "
            f"({int(r['duplicates'])} duplicate, {int(r['other'])} other status), "
            f"{stored} new events stored, {commits} commits "
            f"({r['accepted'] / max(commits, 1):.1f} requests/commit)"
        )
        log(f"        {r['cpu']}")
        log(f"        command: {r['command']}")
    ratio = results["group"]["accepted_per_s"] / max(results["per-request"]["accepted_per_s"], 1)
    log(f"ingest  group commit / one commit per request = {ratio:.1f}x")

    # fsyncs: a fixed number of accepts at 32 connections, under strace.
    for mode, group in (("group", "true"), ("per-request", "false")):
        server = f'durability = "full"\ngroup_commit = {group}'
        with Host(f"fsync-{mode}", server, INGEST_SOURCES, {"github": "github"},
                  strace=True) as host:
            run_id = f"fsync-{mode}-{int(time.time())}"
            commits_before = host.metrics().get("hookd_inbox_commits_total", 0)
            r = wrk(host.url, "ingest.lua", [corpus, run_id, 10], 1, 32, "300s",
                    quota=args.fsync_requests)
            time.sleep(0.5)
            commits = host.metrics().get("hookd_inbox_commits_total", 0) - commits_before
            host.stop()
        fsyncs = parse_strace(host.strace_out)
        log(
            f"fsync   group_commit={group:5}  {int(r['accepted'])} x 202 at 32 connections: "
            f"{fsyncs} fsync/fdatasync calls, {commits} commits "
            f"({r['accepted'] / max(fsyncs, 1):.1f} acknowledged requests per fsync)"
        )
    log(f"        command: strace -f -c -e trace=fsync,fdatasync -o FILE hookd serve ... ; "
        f"wrk -t1 -c32 -s bench/ingest.lua URL -- CORPUS RUN 10 {args.fsync_requests} DONE_FILE")


def outage(args) -> None:
    """Ingest through a downstream outage: accepts/s with every key's head waiting on a retry,
    against the same source with its handler not loaded, alternating, OUTAGE_ROUNDS times."""
    corpus = WORK / "outage.tsv"
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(BENCH / "corpus.py"), str(corpus), "--count", "1000", "--size",
         "1500", "--secret", SECRET, "--fail-for-ms", "3600000"],
        check=True,
    )
    rates = {"absent": [], "failing": []}
    for round_ in range(args.outage_rounds):
        for label in ("absent", "failing") if round_ % 2 == 0 else ("failing", "absent"):
            wasm = "flaky" if label == "failing" else None
            with Host(f"outage-{label}", 'durability = "full"', dispatch_sources("flaky"),
                      {"github": "github", "flaky": wasm}) as host:
                run_id = f"outage-{label}-{round_}-{int(time.time())}"
                # Every key gets a head: failing, its retry an hour away (or, with no handler,
                # never run), and deliveries queued behind it.
                wrk(host.url, "ingest.lua", [corpus, f"warm-{run_id}"], args.threads,
                    args.connections, args.warmup)
                wait_quiet()
                r = wrk(host.url, "ingest.lua", [corpus, run_id], args.threads,
                        args.connections, args.duration, host)
                states = host.states()
            rates[label].append(r["accepted_per_s"])
            log(f"outage  round {round_ + 1} handler {label:8} {r['accepted_per_s']:8.0f} "
                f"accepted/s  p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
                f"max {r['max_ms']:.1f} ms  | deliveries {states}")
            log(f"        {r['cpu']}")
    ratios = [f / a for f, a in zip(rates["failing"], rates["absent"])]
    log("outage  every key waiting on a retry / handler not loaded, per round: "
        + " / ".join(f"{x:.2f}" for x in ratios) + " x")
    log(f"        command: wrk -t{args.threads} -c{args.connections} -d{args.duration} "
        f"-s bench/ingest.lua URL -- {corpus} RUN")


def parse_strace(path: Path) -> int:
    total = 0
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync"):
            # % time, seconds, usecs/call, calls, [errors], syscall
            total += int(parts[3])
    return total


# --- dispatch -------------------------------------------------------------------------------

def dispatch_sources(handler: str) -> str:
    return f"""
[sources.github]
scheme = "github"
secrets = ["{SECRET}"]
parser = "github"
handlers = ["{handler}"]
"""


def wait_for(states, done_target: int, timeout: float, poll: float = 0.05) -> dict:
    """Polls `states` (deliveries by state, read from the run's database: `Host.states` or a
    count across a cluster) until `done_target` deliveries are done; returns the last reading.
    When they finished is [`done_span`]'s to say, not the poll's."""
    deadline = time.time() + timeout
    while True:
        m = states()
        if m.get("done", 0) >= done_target:
            return m
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {done_target} done deliveries: {m}")
        time.sleep(poll)


STATES = ("pending", "running", "retrying", "done", "dead", "stale")


def done_span(query) -> tuple:
    """(first, last): when the first and the last done delivery finished, as hookd recorded it
    (`updated_at`, unix ms; its commit follows within the writer's batch), in seconds since the
    epoch; `query` runs one SQL count against the run's database. What a run is timed by, not
    when a poll happened to see it: the wait after posting and the poll's period would
    otherwise count as handling time."""
    sql = "SELECT {}(updated_at) FROM deliveries WHERE state = 'done'"
    return int(query(sql.format("MIN"))) / 1000, int(query(sql.format("MAX"))) / 1000


def post(host: Host, events: int, body: dict, run_id: str, connections: int = 64) -> tuple:
    """Posts up to `events` distinct signed events (one wrk thread, stopped after its quota).
    Returns wrk's result and the number of deliveries hookd stored (the figure to wait for; None
    on PostgreSQL, which the cluster scenario counts itself)."""
    body_bytes = json.dumps(body, separators=(",", ":")).encode()
    signature = hmac.new(SECRET.encode(), body_bytes, hashlib.sha256).hexdigest()
    corpus = host.dir / f"{run_id}.tsv"
    corpus.write_text(f"sha256={signature}\t{body_bytes.decode()}\n")
    result = wrk(host.url, "ingest.lua", [corpus, run_id, 0], 1, connections, "300s",
                 quota=events)
    time.sleep(0.5)  # requests cut off in flight finish (or not) on the server side
    if not host.sqlite:
        return result, None
    m = host.states()
    return result, sum(m.get(state, 0) for state in STATES)


def dispatch(args) -> None:
    n = args.events
    # 1. End to end: post N events while the workers handle them; time until all are done.
    rates = {}
    for handler, wasm, body in (
        ("counter", "counter", {"action": "created", "note": "bench"}),
        ("flaky", "flaky", {"action": "created", "note": "bench"}),
    ):
        with Host(f"dispatch-{handler}", 'durability = "full"', dispatch_sources(handler),
                  {"github": "github", handler: wasm}) as host:
            wait_quiet()
            start = time.time()
            posted, total = post(host, n, body, f"e2e-{handler}")
            m = wait_for(host.states, total, timeout=600)
            seconds = done_span(host.count)[1] - start
            rates[handler] = total / seconds
            log(
                f"dispatch end-to-end  handler={handler:8} {total} events accept->done in "
                f"{seconds:.2f} s = {total / seconds:8.0f} handled/s  (posting alone took "
                f"{posted['seconds']:.2f} s; {m.get('done')} done, {m.get('dead', 0)} dead)"
            )
            if handler == "counter":
                host.stop()
                attempts = host.count("SELECT COUNT(*) FROM attempts")
                conflicts = host.count("SELECT COUNT(*) FROM attempts WHERE outcome = 'conflict'")
                log(f"        counter attempts: {attempts} ({conflicts} state conflicts re-run, "
                    f"{conflicts / max(attempts - conflicts, 1):.3f} per success)")
    log(f"dispatch end-to-end  counter (one hot state key) / flaky (stateless) = "
        f"{rates['counter'] / rates['flaky']:.2f} x")

    # 2. Drain: N events stored while the handler's file is absent, then the file appears.
    for handler, wasm in (("counter", "counter"), ("flaky", "flaky")):
        with Host(f"drain-{handler}", 'durability = "full"', dispatch_sources(handler),
                  {"github": "github"}) as host:
            wait_quiet()
            _, total = post(host, n, {"action": "created"}, f"drain-{handler}")
            shutil.copy(WASM / f"{wasm}.wasm", host.dir / "plugins" / f"{handler}.wasm")
            wait_for(host.states, total, timeout=600)
            first, last = done_span(host.count)
            log(
                f"dispatch drain       handler={handler:8} {total} stored deliveries done in "
                f"{last - first:.2f} s = {total / (last - first):8.0f} handled/s"
            )

    # 3. Memory: 1 000 handlers waiting at once (flaky with sleep_ms), RSS delta / 1 000.
    k = args.in_flight
    server = f'durability = "full"\nworkers = {k}'
    sources = dispatch_sources("flaky") + "\n[plugins.flaky]\ntimeout_ms = 120000\n"
    with Host("memory", server, sources, {"github": "github", "flaky": "flaky"}) as host:
        # Warm-up round: the same number of short sleeps, so one-time costs (threads, code
        # pages, allocator arenas, connection caches) are not charged to the handlers.
        wait_quiet()
        _, warm = post(host, k, {"sleep_ms": 50}, "mem-warm")
        wait_for(host.states, warm, timeout=120)
        time.sleep(1)
        base = host.rss_kib()
        started = time.time()
        _, total = post(host, k, {"sleep_ms": args.sleep_ms}, "mem-run")
        waiting = total - warm  # the quota run may cut one request off: count what was stored
        deadline = started + args.sleep_ms / 1000 * 0.8
        peak, seen = base, 0
        while time.time() < deadline:
            m = host.states()
            seen = max(seen, m.get("running", 0))
            if m.get("running", 0) >= waiting:
                peak = max(peak, host.rss_kib())
                time.sleep(0.2)
                peak = max(peak, host.rss_kib())
                break
            time.sleep(0.05)
        if seen < waiting or waiting < k * 0.95:
            raise SystemExit(f"only {seen} of {waiting} handlers were running at once")
        per = (peak - base) / waiting
        log(
            f"dispatch memory      {waiting} handlers sleeping at once: RSS {base / 1024:.1f} MiB "
            f"-> {peak / 1024:.1f} MiB = {per:.0f} KiB per in-flight handler"
        )


# --- cluster --------------------------------------------------------------------------------

class Postgres:
    """The PostgreSQL server the cluster scenario uses, reached with psql (the binary itself,
    not Debian's Perl wrapper, which costs more CPU per call than the query)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.base = self.url.rsplit("/", 1)[0]
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))
        self.binary = str(binaries[-1]) if binaries else "psql"

    def psql(self, sql: str, database: str = None) -> str:
        url = f"{self.base}/{database}" if database else self.url
        out = subprocess.run([self.binary, url, "-qtAX", "-c", sql], check=True,
                             capture_output=True, text=True)
        return out.stdout.strip()

    def drop(self, name: str) -> None:
        """Drops the database `name` if it exists. `WITH (FORCE)` ends its sessions, but an
        autovacuum worker running there after a load (no role of ours, so not ours to end)
        refuses it: that is retried until the worker has gone."""
        for attempt in range(30):
            try:
                self.psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                return
            except subprocess.CalledProcessError as e:
                if attempt == 29:
                    raise SystemExit(f"dropping the database {name}: {e.stderr.strip()}")
                time.sleep(1)

    def fresh(self, name: str) -> str:
        """A new, empty database `name` (dropped first if a run left it); its URL."""
        self.drop(name)
        self.psql(f"CREATE DATABASE {name}")
        return f"{self.base}/{name}"

    def settings(self) -> str:
        names = ("server_version", "synchronous_commit", "fsync", "wal_sync_method",
                 "full_page_writes", "commit_delay", "shared_buffers", "max_connections",
                 "wal_level", "max_wal_size")
        return self.psql("SELECT string_agg(name || '=' || current_setting(name), ' ' "
                         "ORDER BY name) FROM pg_settings "
                         f"WHERE name = ANY('{{{','.join(names)}}}')")

    def wal_syncs(self) -> int:
        return int(self.psql("SELECT wal_sync FROM pg_stat_wal"))


def command_ticks(command: str) -> int:
    """CPU time all processes named `command` (the server's, or PgBouncer's with
    `"pgbouncer"`) used so far, in clock ticks."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if f"({command})" in text[:64]:
            total += stat_ticks(text)
    return total


class CpuMeter:
    """CPU used by hookd processes (`pids`), the PostgreSQL server and PgBouncer from its making
    on."""

    def __init__(self, pids: list):
        self.pids = pids
        self.start = self.ticks()

    def ticks(self) -> tuple:
        return (sum(map(proc_jiffies, self.pids)), command_ticks("postgres"),
                command_ticks("pgbouncer"))

    def cores(self, elapsed: float) -> tuple:
        """(hookd, postgres, pgbouncer) in cores over `elapsed` seconds."""
        tick = os.sysconf("SC_CLK_TCK")
        return tuple((now - then) / tick / elapsed for now, then in zip(self.ticks(), self.start))

    def describe(self, elapsed: float) -> str:
        hookd, postgres, pooler = self.cores(elapsed)
        return (f"hookd {hookd:.2f} cores, postgres {postgres:.2f}"
                + (f", pgbouncer {pooler:.2f}" if pooler >= 0.005 else ""))


def count(backend, hosts, sql: str) -> int:
    """`sql`'s count in the database `hosts` share: PostgreSQL's (`backend` = (pg, name)) or
    the first host's SQLite file."""
    if backend:
        pg, name = backend
        return int(pg.psql(sql, name))
    return hosts[0].count(sql)


def cluster_run(label, hosts, pg, args, corpus) -> dict:
    """Durable accepts/s over `hosts` (64 connections split between them, one wrk each)."""
    from concurrent.futures import ThreadPoolExecutor
    run_id = f"{label}-{int(time.time())}"
    split = [args.connections // len(hosts) + (i < args.connections % len(hosts))
             for i in range(len(hosts))]
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(lambda hc: wrk(hc[0].url, "ingest.lua", [corpus, f"warm-{run_id}-{hc[1]}"],
                                     1, hc[1], args.warmup), zip(hosts, split)))
    wait_quiet()
    syncs0 = pg.wal_syncs() if pg else 0
    meter = CpuMeter([h.hookd_pid() for h in hosts])
    started = time.time()
    with ThreadPoolExecutor(len(hosts)) as pool:
        results = list(pool.map(
            lambda ihc: wrk(ihc[1][0].url, "ingest.lua", [corpus, f"{run_id}-{ihc[0]}"], 1,
                            ihc[1][1], args.duration), enumerate(zip(hosts, split))))
    elapsed = time.time() - started
    accepted = sum(r["accepted"] for r in results)
    out = {
        "accepted_per_s": sum(r["accepted_per_s"] for r in results),
        "p50_ms": max(r["p50_ms"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        "accepted": accepted,
        "other": sum(r["other"] for r in results),
        "cpu": meter.describe(elapsed),
        "command": results[0]["command"],
    }
    if pg:
        out["per_sync"] = accepted / max(pg.wal_syncs() - syncs0, 1)
    return out


def cluster_handled(hosts, backend, events: int):
    """Handled events/s: `events` posted (split over `hosts`) while they are handled; with how
    many were stored, the CPU each side used, and on PostgreSQL the WAL bytes the server wrote
    per stored event (a figure the machine's speed does not move)."""
    from concurrent.futures import ThreadPoolExecutor
    wait_quiet()
    share = [events // len(hosts) + (i < events % len(hosts)) for i in range(len(hosts))]
    meter = CpuMeter([h.hookd_pid() for h in hosts])
    lsn0 = backend[0].psql("SELECT pg_current_wal_lsn()", backend[1]) if backend else None
    start = time.time()
    with ThreadPoolExecutor(len(hosts)) as pool:
        posted = list(pool.map(lambda ihn: post(ihn[1][0], ihn[1][1], {"action": "created"},
                                                f"e2e-{ihn[0]}", 64 // len(hosts)),
                               enumerate(zip(hosts, share))))

    def query(sql):  # what the nodes stored, whichever backend they share
        return count(backend, hosts, sql)

    # The handler's deliveries (a backlog row's other handler's stay waiting).
    stored = query("SELECT COUNT(*) FROM deliveries WHERE handler = 'flaky'")
    done = "SELECT COUNT(*) FROM deliveries WHERE handler = 'flaky' AND state = 'done'"
    wait_for(lambda: {"done": query(done)}, stored, timeout=600, poll=0.1)
    elapsed = done_span(query)[1] - start
    posting = max(result["seconds"] for result, _ in posted)
    cpu = (f"posting took {posting:.2f} s, the last done {elapsed:.2f} s after the first "
           f"request; {meter.describe(time.time() - start)}")
    if backend:
        wal = backend[0].psql(f"SELECT pg_current_wal_lsn() - '{lsn0}'::pg_lsn", backend[1])
        cpu += f"; {int(float(wal)) // max(stored, 1)} WAL bytes per event"
    return stored / elapsed, stored, cpu


# A second source whose events are for a handler with no file: they stay waiting, as behind a
# handler that failed to load, and only add rows.
BACKLOG_SOURCE = f"""
[sources.bulk]
scheme = "github"
secrets = ["{SECRET}"]
parser = "github"
handlers = ["absent"]
"""


def fill_backlog(host: Host, corpus: Path, events: int) -> None:
    """Posts `events` of the ingest corpus to BACKLOG_SOURCE (64 connections)."""
    started = time.time()
    result = wrk(host.url, "ingest.lua", [corpus, f"backlog-{time.time_ns()}", 0], 1, 64, "900s",
                 quota=events, env={"HOOK_PATH": "/hooks/bulk"})
    log(f"cluster backlog: {int(result['accepted'])} events waiting for a handler that is not "
        f"loaded, posted in {time.time() - started:.1f} s")


def cluster(args) -> None:
    url = os.environ.get("HOOKD_BENCH_POSTGRES_URL")
    if not url:
        raise SystemExit("the cluster scenario needs HOOKD_BENCH_POSTGRES_URL (bench/run.sh sets it)")
    pooler = os.environ.get("HOOKD_BENCH_PGBOUNCER_URL")
    runs = [("sqlite", 0), ("postgres-1", 1), ("postgres-3", 3)]
    if pooler:
        runs.append(("pgbouncer-1", 1))
    # One node handling behind BACKLOG waiting deliveries of a handler that is not loaded
    # (posted first): the claim's plan is costed by them (see BACKLOG_SOURCE).
    runs.append(("postgres-1-backlog", 1))
    # CLUSTER_ROWS=postgres-1,postgres-3 runs those rows only (the ratios need postgres-1).
    only = [r for r in os.environ.get("CLUSTER_ROWS", "").split(",") if r]
    unknown = sorted(set(only) - {label for label, _ in runs})
    if unknown:
        raise SystemExit(f"CLUSTER_ROWS names no row {', '.join(unknown)} (the rows: "
                         f"{', '.join(label for label, _ in runs)})")
    if only:
        runs = [run for run in runs if run[0] in only]
    pg = Postgres(url)
    log(f"cluster postgres settings: {pg.settings()}")
    corpus = ingest_corpus()
    rows = []
    for label, nodes in runs:
        backlog = label.endswith("-backlog")
        for what in ("handled",) if backlog else ("ingest", "handled"):
            name = f"hookd_bench_{label.replace('-', '_')}_{what}"
            database = pg.fresh(name) if nodes else "hookd.db"
            through_pooler = label.startswith("pgbouncer")
            if through_pooler:
                database = f"{pooler.rstrip('/').rsplit('/', 1)[0]}/{name}"
            if nodes:
                # Loopback: no TLS (hookd's default, `prefer`, would encrypt where the server
                # offers it, as Debian's cluster does), as every figure before TLS existed.
                database += "?sslmode=disable"
            sources = INGEST_SOURCES if what == "ingest" else dispatch_sources("flaky")
            if backlog:
                sources += BACKLOG_SOURCE
            plugins = {"github": "github"} if what == "ingest" else {"github": "github",
                                                                      "flaky": "flaky"}
            # SQLite's durability is its default ("full"); PostgreSQL's is the server's
            # synchronous_commit (printed above).
            server = 'durability = "full"' if not nodes else ""
            if through_pooler:
                server = 'database_pooler = "transaction"'
            hosts = []
            try:
                for i in range(max(nodes, 1)):
                    hosts.append(Host(f"cluster-{label}-{what}-{i}", server, sources, plugins,
                                      database=database))
                if what == "ingest":
                    r = cluster_run(label, hosts, pg if nodes else None, args, corpus)
                    per_sync = (f", {r['per_sync']:.1f} acknowledged requests per WAL flush"
                                if "per_sync" in r else "")
                    log(f"cluster {label:10}  {r['accepted_per_s']:8.0f} accepted/s  "
                        f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  "
                        f"({int(r['accepted'])} x 202, {int(r['other'])} other status; "
                        f"{r['cpu']}{per_sync})")
                    rows.append((label, "accepted/s", r["accepted_per_s"]))
                else:
                    backend = (pg, name) if nodes else None
                    if backlog:
                        fill_backlog(hosts[0], corpus, args.backlog)
                    rate, stored, cpu = cluster_handled(hosts, backend, args.events)
                    log(f"cluster {label:10}  {rate:8.0f} handled/s  ({stored} events posted and "
                        f"handled, stateless flaky; {cpu})")
                    rows.append((label, "handled/s", rate))
            finally:
                for host in hosts:
                    host.__exit__(None, None, None)
            if nodes:
                pg.drop(name)
    base = {what: rate for label, what, rate in rows if label == "postgres-1"}
    for label, what, rate in rows:
        if what in base:
            log(f"cluster ratio {label:10} {what:10} = {rate / base[what]:.2f} x postgres-1")
    log("        command: wrk -t1 -cC -dD --latency -s bench/ingest.lua URL -- CORPUS RUN "
        "(one per node, C = 64 / nodes)")


# --- peer: hookd beside a native receiver -----------------------------------------------------

PEER_SECRET = "whsec_" + base64.b64encode(b"bench-standard-webhooks-key-0001").decode()
PEER_SOURCE = f"""
[sources.sw]
scheme = "standard-webhooks"
secrets = ["{PEER_SECRET}"]
handlers = []
"""
# The GitHub-parsed variant stores one delivery row per event, for a handler whose file is not
# there, so nothing is dispatched: what is measured is ingest with its delivery row.
PEER_GITHUB_SOURCE = INGEST_SOURCES.replace("handlers = []", 'handlers = ["later"]')


class Peer:
    """The native reference receiver (PEER_BIN) in inbox mode, durable like hookd
    (`--sync full --group-commit on`), in its own directory."""

    def __init__(self, binary: Path):
        self.dir = WORK / "peer-native"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.port = free_port()
        self.log = open(self.dir / "peer.log", "w")
        self.proc = subprocess.Popen(
            [str(binary), "--listen", f"127.0.0.1:{self.port}", "--db", str(self.dir / "inbox.db"),
             "--mode", "inbox", "--sync", "full", "--group-commit", "on"],
            stdout=self.log, stderr=self.log, env=dict(os.environ, BENCH_SECRET=PEER_SECRET))
        wait_started(self.proc,
                     lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close(),
                     30, f"the peer did not start; see {self.dir / 'peer.log'}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hookd_pid(self) -> int:  # the process wrk() charges CPU to
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            terminate(self.proc, self.proc.pid, 30)
        self.log.close()


def db_bytes(directory: Path, stem: str) -> int:
    return sum(f.stat().st_size for f in directory.glob(f"{stem}*"))


def peer(args) -> None:
    """hookd and the native receiver side by side: rounds of QUOTA signed Standard Webhooks
    messages each (10% re-sent), 64 connections, each receiver with a database of its own; the
    order rotates every round. Then bytes stored per event."""
    binary = Path(os.environ.get("PEER_BIN", ""))
    if not binary.is_file():
        raise SystemExit("PEER_BIN must name the native peer's binary (bench/run.sh peer builds "
                         "it from PEER_DIR)")
    quota, rounds = args.peer_requests, args.peer_rounds
    github_corpus = ingest_corpus()
    native = Peer(binary)
    plain = Host("peer-hookd", 'durability = "full"', PEER_SOURCE, {})
    github = Host("peer-hookd-github", 'durability = "full"', PEER_GITHUB_SOURCE,
                  {"github": "github"})
    receivers = {"native": native, "hookd": plain, "hookd+github": github}
    results = {name: [] for name in receivers}
    done_file = WORK / "peer-done"
    try:
        for r in range(rounds):
            corpus = WORK / "peer-corpus.tsv"
            subprocess.run(
                [sys.executable, str(BENCH / "corpus.py"), str(corpus), "--count",
                 str(quota * args.threads + 64), "--size", "1500", "--secret", PEER_SECRET,
                 "--standard-webhooks", f"r{r}-{int(time.time())}"], check=True)
            order = list(receivers)[r % 3:] + list(receivers)[:r % 3]
            for name in order:
                target = receivers[name]
                wait_quiet()
                if name == "hookd+github":
                    res = wrk(target.url, "ingest.lua", [github_corpus, f"r{r}-{time.time_ns()}",
                                                        10], args.threads, args.connections,
                              "600s", target, quota=quota)
                else:
                    done_file.unlink(missing_ok=True)
                    res = wrk(target.url, "sw.lua", [corpus, "sw", args.threads, 10, quota,
                                                    done_file],
                              args.threads, args.connections, "600s", target, quota=0,
                              stop_file=done_file)
                results[name].append(res)
                log(f"peer round {r + 1} {name:13} {res['accepted_per_s']:8.0f} accepted/s  "
                    f"p50 {res['p50_ms']:.2f} ms  p99 {res['p99_ms']:.2f} ms  "
                    f"({int(res['accepted'])} x 202, {int(res['duplicates'])} duplicate, "
                    f"{int(res['other'])} other)  {res['cpu']}")
    finally:
        for target in receivers.values():
            target.stop()
    base = results["native"]
    for name, runs in results.items():
        ratios = sorted(run["accepted_per_s"] / b["accepted_per_s"] for run, b in zip(runs, base))
        rates = sorted(run["accepted_per_s"] for run in runs)
        p99s = sorted(run["p99_ms"] for run in runs)
        log(f"peer {name:13} median {rates[len(rates) // 2]:8.0f} accepted/s, median p99 "
            f"{p99s[len(p99s) // 2]:.2f} ms; vs native in the same round: "
            + " / ".join(f"{x:.2f}" for x in ratios) + f" (median {ratios[len(ratios) // 2]:.2f} x)")
    with sqlite3.connect(native.dir / "inbox.db") as db:
        native_events = db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0]
    sizes = {
        "native": (db_bytes(native.dir, "inbox.db"), native_events),
        "hookd": (db_bytes(plain.dir, "hookd.db"), plain.count("SELECT COUNT(*) FROM events")),
        "hookd+github": (db_bytes(github.dir, "hookd.db"),
                         github.count("SELECT COUNT(*) FROM events")),
    }
    for name, (size, events) in sizes.items():
        log(f"peer {name:13} {events} events stored in {size / 1048576:.1f} MiB: "
            f"{size / max(events, 1):.0f} bytes per event")
    for host in (plain, github):
        host.__exit__(None, None, None)
    log(f"        command: wrk -t{args.threads} -c{args.connections} --latency -s bench/sw.lua URL "
        f"-- CORPUS sw {args.threads} 10 {quota} DONE_FILE (hookd+github: bench/ingest.lua)")


# --- retention -------------------------------------------------------------------------------

RETENTION_ARMS = (
    ("off", 'done_after = "forever"'),
    ("on", 'done_after = "30s"\ninterval = "1s"'),
    ("on+forget", 'done_after = "30s"\ndedupe_for = "30s"\ninterval = "1s"'),
)


def seconds(duration: str) -> int:
    """`"600s"`, `"10m"` or `"600"` in seconds."""
    m = re.fullmatch(r"(\d+)([sm]?)", duration)
    if not m:
        raise SystemExit(f"not a duration: {duration}")
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def disk_kib(host: Host) -> int:
    """The SQLite database's size on disk (the file, its WAL and shared memory), in KiB."""
    return sum(f.stat().st_size for f in host.dir.glob("hookd.db*")) // 1024


def free_pages(host: Host) -> tuple:
    """(page_count, freelist_count) of the database, read on a connection of its own."""
    with sqlite3.connect(host.dir / "hookd.db", timeout=10) as db:
        return (db.execute("PRAGMA page_count").fetchone()[0],
                db.execute("PRAGMA freelist_count").fetchone()[0])


def retention(args) -> None:
    """The arms run side by side, each its own hookd under its own paced load, so the machine's
    noise falls on all of them alike and the p99 ratios compare like with like."""
    corpus = ingest_corpus()
    total = seconds(args.retention_duration)
    window = seconds(args.retention_window)
    os.environ["BENCH_DELAY_MS"] = str(args.retention_delay_ms)
    hosts = {}
    try:
        for arm, rules in RETENTION_ARMS:
            sources = INGEST_SOURCES + f"\n[retention]\n{rules}\n"
            hosts[arm] = Host(f"retention-{arm}", 'durability = "full"', sources,
                              {"github": "github"})
        wait_quiet()
        rows = {arm: [] for arm in hosts}
        started = time.time()

        def load(arm: str) -> None:
            host, run_id = hosts[arm], f"{arm}-{int(started)}"
            while time.time() - started < total:
                r = wrk(host.url, "steady.lua", [corpus, f"{run_id}-{len(rows[arm])}"], 1,
                        args.retention_connections, f"{window}s", host)
                at = time.time() - started
                pages, free = free_pages(host)
                rows[arm].append((at, r, disk_kib(host), pages, free))
                log(
                    f"retention {arm:9} t={at:5.0f}s  {r['accepted_per_s']:6.0f} accepted/s  "
                    f"p50 {r['p50_ms']:.2f} ms  p99 {r['p99_ms']:.2f} ms  max {r['max_ms']:.1f} ms"
                    f"  | on disk {disk_kib(host) / 1024:7.1f} MiB  pages {pages} ({free} free)"
                )

        threads = [threading.Thread(target=load, args=(arm,)) for arm in hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        summary = {}
        for arm, host in hosts.items():
            events = host.count("SELECT COUNT(*) FROM events")
            pruned = host.count("SELECT COUNT(*) FROM events WHERE pruned_at IS NOT NULL")
            # Steady state: the windows after the first minute (pruning has started by then).
            steady = [row for row in rows[arm] if row[0] > 60] or rows[arm]
            p99s = sorted(row[1]["p99_ms"] for row in steady)
            summary[arm] = {
                "p99_ms": p99s[len(p99s) // 2],
                "rate": sum(row[1]["accepted_per_s"] for row in steady) / len(steady),
                "end_mib": rows[arm][-1][2] / 1024,
                "growth_mib_per_min": (steady[-1][2] - steady[0][2]) / 1024
                / max((steady[-1][0] - steady[0][0]) / 60, 1e-9),
            }
            log(f"retention {arm:9} stored {events} events at the end, {pruned} of them pruned")
    finally:
        for host in hosts.values():
            host.__exit__(None, None, None)
    off = summary["off"]
    for arm, s in summary.items():
        log(
            f"retention {arm:9} steady state (t > 60 s): {s['rate']:.0f} accepted/s, median "
            f"window p99 {s['p99_ms']:.2f} ms ({s['p99_ms'] / off['p99_ms']:.2f} x off), "
            f"{s['end_mib']:.1f} MiB on disk at the end, growing {s['growth_mib_per_min']:.1f} "
            f"MiB/min"
        )
    log(f"        command: BENCH_DELAY_MS={args.retention_delay_ms} wrk -t1 "
        f"-c{args.retention_connections} -d{window}s --latency -s bench/steady.lua URL -- "
        f"CORPUS RUN (repeated for {total} s, one per hookd, the {len(hosts)} side by side)")


SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
LANGUAGES = ("rust", "javascript", "python")


def sw_post(host: Host, source: str, event_id: str, body: dict) -> None:
    """Posts `body` as event `event_id`, signed as Standard Webhooks does, expecting a 2xx."""
    data = json.dumps(body, separators=(",", ":")).encode()
    ts = str(int(time.time()))
    key = base64.b64decode(SW_SECRET.removeprefix("whsec_"))
    mac = hmac.new(key, f"{event_id}.{ts}.".encode() + data, hashlib.sha256).digest()
    request = urllib.request.Request(f"{host.url}/hooks/{source}", data=data, headers={
        "content-type": "application/json", "webhook-id": event_id,
        "webhook-timestamp": ts, "webhook-signature": "v1," + base64.b64encode(mac).decode(),
    })
    with urllib.request.urlopen(request, timeout=60) as r:
        r.read()


def language_sources(handlers, port: int) -> str:
    """A standard-webhooks source per handler; each handler may reach 127.0.0.1:`port`."""
    text = ""
    for h in handlers:
        text += (f'\n[sources.{h}]\nscheme = "standard-webhooks"\nsecrets = ["{SW_SECRET}"]\n'
                 f'handlers = ["{h}"]\n[plugins.{h}]\nmax_file_mib = 64\ntimeout_ms = 60000\n'
                 f'allow_hosts = ["127.0.0.1:{port}"]\n')
    return text


def wait_loaded(host: Host, names, timeout: float = 300) -> float:
    """Seconds until every plugin in `names` is live (loaded, no error)."""
    started = time.time()
    while True:
        plugins = {p["name"]: p for p in json.loads(host.get("/admin/plugins"))}
        if all(plugins.get(n, {}).get("sha256") and not plugins[n].get("error") for n in names):
            return time.time() - started
        if time.time() - started > timeout:
            raise SystemExit(f"plugins did not load: {plugins}")
        time.sleep(0.02)


class SlowServer:
    """An HTTP server on 127.0.0.1 answering every request after `hold` seconds."""

    def __init__(self, hold: float):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(hold)
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def languages(args) -> None:
    """The scenario plugin in Rust, JavaScript and Python (bench/run.sh builds them into
    target/bench/languages/): start-up with and without the compile cache, and resident memory
    per in-flight handler."""
    built = WORK / "languages"
    wasm = {lang: built / f"{lang}.wasm" for lang in LANGUAGES}
    slow = SlowServer(hold=args.hold_ms / 1000)
    sources = language_sources(LANGUAGES, slow.port)
    # 1. Start-up: every plugin compiled (an empty cache), then a restart on the same directory.
    wait_quiet()
    started = time.time()
    with Host("languages-start", "", sources, wasm) as host:
        wait_loaded(host, LANGUAGES)
        cold = time.time() - started
    started = time.time()
    with Host("languages-start", "", sources, {}, fresh=False) as host:
        wait_loaded(host, LANGUAGES)
        warm = time.time() - started
    log(f"languages start-up   one plugin of each language: {cold:.2f} s with an empty compile "
        f"cache, {warm:.2f} s restarted with it (process start to every plugin live)")
    # 2. Memory: K handlers of one language waiting at once on a slow HTTP call.
    k = args.lang_in_flight
    for lang in LANGUAGES:
        with Host(f"languages-{lang}", "", language_sources([lang], slow.port),
                  {lang: wasm[lang]}) as host:
            wait_loaded(host, [lang])
            wait_quiet()
            for i in range(k):  # warm-up round: one-time costs are not the handlers'
                sw_post(host, lang, f"warm-{i}", {"do": "stale"})
            wait_for(host.states, k, timeout=120)
            time.sleep(1)
            base = host.rss_kib()
            for i in range(k):
                sw_post(host, lang, f"hold-{i}", {"do": "fetch",
                                                  "url": f"http://127.0.0.1:{slow.port}/x"})
            peak, seen = base, 0
            deadline = time.time() + args.hold_ms / 1000 * 0.8
            while time.time() < deadline:
                running = host.states().get("running", 0)
                seen = max(seen, running)
                if running >= k:
                    time.sleep(0.2)
                    peak = max(peak, host.rss_kib())
                    break
                time.sleep(0.05)
            if seen < k:
                raise SystemExit(f"{lang}: only {seen} of {k} handlers were running at once")
            wait_for(host.states, 2 * k, timeout=120)
            log(f"languages memory     {lang:10} {k} handlers waiting at once: RSS "
                f"{base / 1024:.1f} MiB -> {peak / 1024:.1f} MiB = "
                f"{(peak - base) / k / 1024:.2f} MiB per in-flight handler")
    slow.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario",
                        choices=["ingest", "dispatch", "cluster", "retention", "languages", "peer",
                                 "outage", "all"])
    parser.add_argument("--duration", default=os.environ.get("DURATION", "30s"))
    parser.add_argument("--warmup", default=os.environ.get("WARMUP", "5s"))
    parser.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    parser.add_argument("--connections", type=int,
                        default=int(os.environ.get("CONNECTIONS", "64")))
    parser.add_argument("--fsync-requests", type=int,
                        default=int(os.environ.get("FSYNC_REQUESTS", "2000")))
    parser.add_argument("--events", type=int, default=int(os.environ.get("EVENTS", "20000")))
    parser.add_argument("--backlog", type=int, default=int(os.environ.get("BACKLOG", "100000")))
    parser.add_argument("--in-flight", type=int, default=int(os.environ.get("IN_FLIGHT", "1000")))
    parser.add_argument("--sleep-ms", type=int, default=int(os.environ.get("SLEEP_MS", "20000")))
    parser.add_argument("--retention-duration",
                        default=os.environ.get("RETENTION_DURATION", "600s"))
    parser.add_argument("--retention-window", default=os.environ.get("RETENTION_WINDOW", "10s"))
    parser.add_argument("--retention-connections", type=int,
                        default=int(os.environ.get("RETENTION_CONNECTIONS", "8")))
    parser.add_argument("--retention-delay-ms", type=int,
                        default=int(os.environ.get("RETENTION_DELAY_MS", "10")))
    parser.add_argument("--lang-in-flight", type=int,
                        default=int(os.environ.get("LANG_IN_FLIGHT", "32")))
    parser.add_argument("--hold-ms", type=int, default=int(os.environ.get("HOLD_MS", "6000")))
    parser.add_argument("--peer-requests", type=int,
                        default=int(os.environ.get("PEER_REQUESTS", "35000")))
    parser.add_argument("--peer-rounds", type=int, default=int(os.environ.get("PEER_ROUNDS", "3")))
    parser.add_argument("--outage-rounds", type=int,
                        default=int(os.environ.get("OUTAGE_ROUNDS", "2")))
    args = parser.parse_args()
    if args.scenario in ("ingest", "all"):
        ingest(args)
    if args.scenario in ("dispatch", "all"):
        dispatch(args)
    if args.scenario in ("cluster", "all"):
        cluster(args)
    if args.scenario in ("retention", "all"):
        retention(args)
    if args.scenario in ("languages", "all"):
        languages(args)
    if args.scenario == "peer":
        peer(args)
    if args.scenario == "outage":
        outage(args)


if __name__ == "__main__":
    main()
