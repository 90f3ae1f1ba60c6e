#!/usr/bin/env python3
"""Log one training iteration of a PyTorch model as a trace in the DTR paper's
format (JSON Lines; ../shared/traces/dtr-paper/README.md), for replaying
models that are not in ../shared through remat (`remat replay OUT ...`).

    scripts/log-torch-trace.py MODEL BATCH OUT [--seq N]

MODEL is a torchvision classifier (`resnet50`, `efficientnet_b0`,
`densenet121`, `swin_t`, ...: any name in `torchvision.models` whose
constructor takes no argument; input 3x224x224, cross-entropy loss) or one of
the Hugging Face `transformers` language models `gpt2` (GPT-2 small), `bert`
(BERT-base, masked LM) and `llama` (an 8-layer 768-wide Llama with grouped
KV heads, vocabulary 32 000), all with eager attention; `--seq` sets their
sequence length (default 1024, BERT 512). Needs `torch`, `torchvision` and,
for the language models, `transformers` (not needed by anything else in this
repository). Write traces outside the repository: no trace is committed.

How it logs (the recipe of ../shared/traces/torch/README.md):
- every aten operator of one iteration (forward, loss, backward; no optimizer
  step) is intercepted below autograd on PyTorch's `meta` device: real shapes
  and lifetimes, no data, seconds of CPU time;
- parameters, buffers and inputs are CONSTANTs; a result sharing an
  argument's storage is `ALIAS k`; in-place and `out=` arguments make a
  MUTATE; `detach` is a COPY; every tensor autograd saves for backward gets a
  COPY name that is RELEASEd when autograd frees it, and every tensor is
  RELEASEd when PyTorch frees it, so saved activations live until their
  backward ran;
- dropout is logged as CUDA's fused `native_dropout` (the meta device would
  otherwise decompose it as CPU does);
- TIME is a roofline for an A100-class GPU, not a timing:
  max(flops / 150e12, bytes / 1.5e12) s + 5 us, flops from
  `torch.utils.flop_counter` (matmuls, convolutions, attention), bytes the
  tensors read and written; views and pure allocations 1 us.

Checked against the shared traces made with the same recipe (`remat replay
<trace> --ratio 1 --json`, fields `budget_bytes`, the peak, and
`baseline_compute_ns`): ResNet-50 at batch 96 peaks 0.005 % below
resnet50-96.log and computes 0.5 % more; GPT-2 at batch 2 peaks 3.7 % below
gpt2-2.log and computes 0.2 % less (the cause, not traced, may be the
`transformers` version). So traces from this script are the same kind of
graph as the shared ones, not copies of them line for line.
"""
import argparse
import gc
import json
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

PEAK_FLOPS = 150e12  # FLOP/s
PEAK_BYTES = 1.5e12  # B/s
LAUNCH_NS = 5_000
FLAT_NS = 1_000  # views and pure allocations


class Log:
    """Names tensors when first met and writes instructions."""

    def __init__(self, out):
        self.out = out
        self.count = 0
        self.constants = set()

    def emit(self, **fields):
        if not self.out.closed:
            self.out.write(json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n")

    def fresh(self):
        self.count += 1
        return f"x{self.count}"

    @staticmethod
    def name(t):
        return getattr(t, "_trace_name", None)

    def bind(self, t, name):
        t._trace_name = name
        self.release_when_freed(t, name)

    def release_when_freed(self, obj, name):
        weakref.finalize(obj, lambda: self.emit(INSTRUCTION="RELEASE", NAME=name))

    def constant(self, t):
        name = self.fresh()
        self.constants.add(name)
        self.emit(INSTRUCTION="CONSTANT", NAME=name)
        self.emit(INSTRUCTION="MEMORY", MEMORY=str(t.untyped_storage().nbytes()), NAME=name)
        self.bind(t, name)
        return name

    def name_of(self, t):
        # A tensor met first as an argument (made outside the logged ops) is
        # a constant, as the paper's traces treat inputs.
        return self.name(t) or self.constant(t)


def storage_key(t):
    return t.untyped_storage()._cdata


def tensor_bytes(t):
    return t.numel() * t.element_size()


def op_name(func):
    packet = func._overloadpacket.__name__
    overload = func._overloadname
    return packet if overload in ("default", "Tensor") else f"{packet}_{overload}"


class Logger(TorchDispatchMode):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        log = self.log
        out = func(*args, **kwargs)
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        arg_names = [log.name_of(a) for a in inputs]
        mutated = self.mutated(func, args, kwargs, inputs)
        name = op_name(func)
        new = [o for o in outputs if log.name(o) is None]
        if name == "detach" and len(new) == 1:
            dst = log.fresh()
            log.emit(INSTRUCTION="COPY", DST=dst, SRC=arg_names[0])
            log.bind(new[0], dst)
            return out
        keys = [storage_key(a) for a in inputs]
        view = bool(new) and not mutated and all(storage_key(o) in keys for o in new)
        allocation = name.startswith("empty") and not mutated
        time = FLAT_NS if view or allocation else self.roofline(func, args, kwargs, out, inputs, mutated, new)
        if not new:
            if mutated:
                log.emit(INSTRUCTION="MUTATE", NAME=name, ARGS=arg_names, MUTATE=mutated, TIME=str(time))
            return out
        results = [log.fresh() for _ in new]
        log.emit(INSTRUCTION="CALL", NAME=name, ARGS=arg_names, RESULT=results, TIME=str(time))
        for o, r in zip(new, results):
            log.emit(INSTRUCTION="MEMORY", MEMORY=str(o.untyped_storage().nbytes()), NAME=r)
            k = next((i for i, key in enumerate(keys) if key == storage_key(o)), -1)
            log.emit(INSTRUCTION="ALIAS", ALIAS=str(k), NAME=r)
            log.bind(o, r)
        if mutated:
            # An op with fresh results that also writes an argument in place.
            log.emit(INSTRUCTION="MUTATE", NAME=name, ARGS=arg_names, MUTATE=mutated, TIME="0")
        return out

    @staticmethod
    def mutated(func, args, kwargs, inputs):
        """Indices into `inputs` of the tensors the op writes (schema alias_info)."""
        written = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written.extend(v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor))
        return sorted({k for k, t in enumerate(inputs) for w in written if t is w})

    @staticmethod
    def roofline(func, args, kwargs, out, inputs, mutated, new):
        flops = 0
        if func._overloadpacket in flop_registry:
            try:
                flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
            except Exception:  # a counter that does not take this overload
                flops = 0
        seen = set()
        moved = 0
        for t in inputs:
            if id(t) not in seen:
                seen.add(id(t))
                moved += tensor_bytes(t)
        moved += sum(tensor_bytes(inputs[i]) for i in mutated)
        moved += sum(tensor_bytes(o) for o in new)
        return int(round(max(flops / PEAK_FLOPS, moved / PEAK_BYTES) * 1e9)) + LAUNCH_NS


class Saved:
    """What autograd holds for a saved tensor: its COPY name lives as long."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


def fused_dropout(input, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return input
    return torch.ops.aten.native_dropout(input, p, True)[0]


def build(model, batch, seq):
    """The model on the meta device, its inputs, and one forward with loss."""
    if model in ("gpt2", "bert", "llama"):
        import transformers as tf

        if model == "gpt2":
            net = tf.GPT2LMHeadModel(tf.GPT2Config(attn_implementation="eager"))
        elif model == "bert":
            net = tf.BertForMaskedLM(tf.BertConfig(attn_implementation="eager"))
            seq = seq or 512
        else:
            cfg = tf.LlamaConfig(
                hidden_size=768,
                intermediate_size=2048,
                num_hidden_layers=8,
                num_attention_heads=12,
                num_key_value_heads=4,
                vocab_size=32000,
                attn_implementation="eager",
            )
            net = tf.LlamaForCausalLM(cfg)
        net = net.to("meta")
        ids = torch.zeros(batch, seq or 1024, dtype=torch.long, device="meta")
        return net, [ids], lambda: net(input_ids=ids, labels=ids).loss
    import torchvision.models as tvm

    ctor = getattr(tvm, model, None)
    if ctor is None or not callable(ctor):
        raise SystemExit(f"unknown model {model!r}: a torchvision model name, gpt2, bert or llama")
    net = ctor().to("meta")
    x = torch.empty(batch, 3, 224, 224, device="meta")
    y = torch.zeros(batch, dtype=torch.long, device="meta")
    return net, [x, y], lambda: torch.nn.functional.cross_entropy(net(x), y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("batch", type=int)
    ap.add_argument("out")
    ap.add_argument("--seq", type=int, default=None)
    a = ap.parse_args()
    if a.batch < 1:
        raise SystemExit(f"batch must be at least 1, got {a.batch}")
    torch.manual_seed(0)
    torch.nn.functional.dropout = fused_dropout
    net, inputs, forward = build(a.model, a.batch, a.seq)
    net.train()
    with open(a.out, "w") as out:
        log = Log(out)
        log.emit(ANNOTATION="START", INSTRUCTION="ANNOTATE")
        for t in list(net.parameters()) + list(net.buffers()) + inputs:
            log.constant(t)

        def pack(t):
            if log.name(t) is None or log.name(t) in log.constants:
                return t
            saved = Saved(t)
            dst = log.fresh()
            log.emit(INSTRUCTION="COPY", DST=dst, SRC=log.name(t))
            log.release_when_freed(saved, dst)
            return saved

        def unpack(saved):
            return saved.tensor if isinstance(saved, Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack), Logger(log):
            loss = forward()
            log.emit(ANNOTATION="BACKWARD", INSTRUCTION="ANNOTATE")
            loss.backward()
            del loss
        gc.collect()


if __name__ == "__main__":
    main()
