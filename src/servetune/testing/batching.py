"""A continuous-batching engine on a simulated clock, step by step as vLLM's scheduler runs it: the physics of the
simulated engine (`servetune.testing.simengine`).

Every step decodes one token of each running request and fills what is left of its token budget
(`max_batched_tokens`) with prefill, first come first served (a prompt split over steps, several prompts packed in
one); a step takes `step_ms + decode_ms x decoding + prefill_ms_per_token x prefill tokens`, noisy (a lognormal draw
per step, and now and then a stall of `stall_ms`, as a busy machine gives). A request is admitted while fewer than
`max_num_seqs` run and the KV cache holds its prompt, and waits in a FIFO queue otherwise; when decoding fills the
cache, the request admitted last is preempted (it keeps the tokens it sent, and is prefilled again, prompt and
output, when it is admitted again). A level's fill and drain, the batch that grows with the rate, the decode gaps a
prefill chunk stalls, the queue past capacity and the slower steps of a bigger batch all come of these few rules.

Steps with the same batch are alike, so the loop goes from event to event (an arrival that can be admitted, a prompt
prefilled, a reply finished, the KV cache full) and draws the times of the steps between at once.
"""

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

MAX_SEGMENT = 4096  # steps drawn at once


@dataclass(frozen=True)
class Physics:
    """How one config of one machine serves: a step's cost and the scheduler's limits."""

    step_ms: float  # a step's fixed cost (reading the weights, launching it)
    decode_ms: float  # per request decoded in the step
    prefill_ms_per_token: float  # per prompt token prefilled in the step
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192  # a step's token budget: one per decoding request, the rest prefill
    kv_tokens: int = 1 << 40  # the KV cache, in tokens
    noise: float = 0.05  # lognormal sigma of a step's time
    stall_share: float = 0.0  # steps that stall
    stall_ms: float = 0.0

    def step(self, decoding: float, prefill_tokens: float = 0.0) -> float:
        """A step's time (ms) without noise."""
        return self.step_ms + self.decode_ms * decoding + self.prefill_ms_per_token * prefill_tokens


@dataclass
class Served:
    """What the engine did with a level's requests (times in ms after the level's origin): when each was due, sent (nan:
    never, by the horizon), produced its first token and ended (nan: not by the horizon), and every token's time
    (`tokens`)."""

    due_ms: np.ndarray
    sent_ms: np.ndarray
    first_ms: np.ndarray
    end_ms: np.ndarray
    step_end_ms: np.ndarray  # every step's end, in order
    runs: list[list[tuple[int, int]]]  # per request: (step of its first token, tokens) of each stretch it decoded

    def tokens(self, i: int) -> np.ndarray:
        """The times (ms) request i's tokens came, up to the horizon."""
        parts = [self.step_end_ms[s:s + n] for s, n in self.runs[i]]
        return np.concatenate(parts) if parts else np.zeros(0)


class _Engine:
    """The scheduler's state between steps (see `serve`)."""

    def __init__(self, physics: Physics, prompts: np.ndarray, outputs: np.ndarray):
        self.physics, self.prompts, self.outputs = physics, prompts, outputs
        n = len(prompts)
        self.first, self.end = np.full(n, np.nan), np.full(n, np.nan)
        self.runs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.sent = np.zeros(n, dtype=np.int64)  # output tokens a request has sent (kept through a preemption)
        self.held = np.zeros(n, dtype=np.int64)  # KV tokens it took when admitted (`_release` adds its decoding)
        self.waiting: deque[int] = deque()
        self.prefilling: deque[list[int]] = deque()  # [request, prompt tokens left]
        self.decoding: dict[int, int] = {}  # request -> step of its first token in this stretch
        self.finishing: list[tuple[int, int]] = []  # heap of (step of its last token, request)
        self.admitted: dict[int, None] = {}  # running requests in the order admitted (the last is preempted first)
        self.kv_used = 0
        self.pending = 0  # prompt tokens left to prefill
        self.steps = 0  # steps done

    @property
    def running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    def admit(self) -> None:
        """Admit waiting requests, first come first served, while a sequence slot is free, the next step has prefill
        budget left for them (vLLM schedules a waiting request only into a step that gives it tokens) and the KV
        cache holds their prompt with a step of decoding to spare."""
        budget = self.physics.max_batched_tokens - len(self.decoding)
        running = self.running
        while self.waiting and running < self.physics.max_num_seqs and self.pending < budget:
            i = self.waiting[0]
            need = int(self.prompts[i] + self.sent[i])
            if self.kv_used + need + running > self.physics.kv_tokens and running:
                return
            running += 1
            self.waiting.popleft()
            self.kv_used += need
            self.held[i] = need
            self.prefilling.append([i, need])
            self.pending += need
            self.admitted[i] = None

    def preempt(self) -> None:
        """Preempt the request admitted last: it keeps the tokens it sent and waits at the head of the queue."""
        i, _ = self.admitted.popitem()
        if i in self.decoding:
            start = self.decoding[i]
            got = self.steps - start
            self.runs[i][-1] = (start, got)
            self.sent[i] += got
            self.finishing = [(last, j) for last, j in self.finishing if j != i]
            heapq.heapify(self.finishing)
        else:
            self.pending -= next(p[1] for p in self.prefilling if p[0] == i)
            self.prefilling = deque(p for p in self.prefilling if p[0] != i)
        self._release(i)
        self.waiting.appendleft(i)

    def _release(self, i: int) -> None:
        """Free request i's KV cache: what it took when admitted, and a token for each step it decoded since its first
        token of this stretch (the step of that token, `decoding[i]`, adds none)."""
        start = self.decoding.pop(i, None)
        self.kv_used -= int(self.held[i]) + (self.steps - 1 - start if start is not None else 0)
        self.held[i] = 0

    def advance(self, k: int, stamps: np.ndarray, per_step: int) -> int:
        """Account for `k` steps that ended at `stamps`, each prefilling `per_step` tokens; how many replies ended."""
        n_dec = len(self.decoding)
        self.steps += k
        self.kv_used += n_dec * k
        last_step, left = self.steps - 1, per_step * k
        while left > 0 and self.prefilling:  # the prompts these steps finished: their first token is the last step's
            head = self.prefilling[0]
            take = min(left, head[1])
            head[1] -= take
            left -= take
            self.pending -= take
            if head[1]:
                break
            self.prefilling.popleft()
            i = head[0]
            if math.isnan(self.first[i]):
                self.first[i] = float(stamps[-1])
            remaining = int(self.outputs[i] - self.sent[i])
            self.runs[i].append((last_step, remaining))
            self.decoding[i] = last_step
            heapq.heappush(self.finishing, (last_step + remaining - 1, i))
        ended = 0
        while self.finishing and self.finishing[0][0] <= last_step:
            _, i = heapq.heappop(self.finishing)
            ended += 1
            self._release(i)
            del self.admitted[i]
            self.sent[i] = self.outputs[i]
            self.end[i] = float(stamps[-1])
        return ended

    def steps_to_event(self, per_step: int) -> int:
        """Steps until the batch changes: a reply's last token, a prompt prefilled, the KV cache full (0: full now)."""
        k = MAX_SEGMENT
        if self.finishing:
            k = min(k, self.finishing[0][0] - self.steps + 1)
        if per_step:
            k = min(k, -(-self.prefilling[0][1] // per_step))
        if self.decoding:
            room = self.physics.kv_tokens - self.kv_used
            k = min(k, room // len(self.decoding))
        return max(0, k)


def serve(physics: Physics, due_ms: np.ndarray, prompts: np.ndarray, outputs: np.ndarray, rng: np.random.Generator,
          horizon_ms: float = math.inf, max_concurrency: int | None = None) -> Served:
    """Run the engine over requests due at `due_ms` (ms, any order) with these prompt and output lengths, until each
    has ended or the clock passes `horizon_ms`. With `max_concurrency` the client keeps at most that many in flight:
    a request due while all are busy is sent when one ends (a closed loop, at rate inf). The loop runs once per event
    (hundreds of thousands in a judged tune), so it keeps the sends in plain lists and reads the scheduler's state
    directly."""
    due_ms = np.asarray(due_ms, dtype=float)
    order = np.argsort(due_ms, kind="stable")
    due, ids = due_ms[order].tolist(), order.tolist()
    engine = _Engine(physics, np.asarray(prompts, dtype=np.int64), np.maximum(np.asarray(outputs, dtype=np.int64), 1))
    n = len(due_ms)
    sent = np.full(n, np.nan)
    slots: deque[float] = deque([-math.inf] * (max_concurrency or n))  # when each free client slot freed
    stamps_all: list[np.ndarray] = []
    t, nxt = 0.0, 0
    while t <= horizon_ms:
        while True:  # the requests sent by now join the queue; `send`: the next one's send
            send = max(due[nxt], slots[0]) if nxt < n and slots else math.inf
            if send > t:
                break
            sent[ids[nxt]] = send
            slots.popleft()
            engine.waiting.append(ids[nxt])
            nxt += 1
        if engine.waiting:
            engine.admit()
        n_dec = len(engine.decoding)
        running = n_dec + len(engine.prefilling)
        if not running:
            if send == math.inf:
                break
            t = send
            continue
        per_step = max(0, min(physics.max_batched_tokens - n_dec, engine.pending))
        k = engine.steps_to_event(per_step)
        if k == 0:
            engine.preempt()
            continue
        times = physics.step(n_dec, per_step) * np.exp(physics.noise * rng.standard_normal(k))
        if physics.stall_share:
            times += physics.stall_ms * (rng.random(k) < physics.stall_share)
        stamps = times.cumsum()
        stamps += t
        if running < physics.max_num_seqs and send < stamps[-1]:  # an arrival it could admit: stop there
            k = int(stamps.searchsorted(send)) + 1
            stamps = stamps[:k]
        stamps_all.append(stamps)
        t = float(stamps[-1])
        ended = engine.advance(k, stamps, per_step)
        if ended:
            slots.extend([t] * ended)
    step_end = np.concatenate(stamps_all) if stamps_all else np.zeros(0)
    return Served(due_ms, sent, engine.first, engine.end, step_end, engine.runs)
