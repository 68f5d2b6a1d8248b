"""ONNX Runtime as a peer: export the model with its control flow as ONNX Loop/If and run
it in an InferenceSession.

Two exporters are tried. The TorchScript one (torch.onnx.export of the scripted model,
dynamo=False) turns scripted loops and branches into Loop and If. The dynamo one
(torch.export) keeps control flow only where the model uses torch.cond / torch.while_loop:
it unrolls Python loops (so it is not tried on models with loops) and stops at a
data-dependent branch. An export without Loop/If of a model that has control flow is a
traced graph: it would compute wrong results for other inputs, so it is reported as
unsupported, not timed as this model.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import re

import torch

from cocktailer.ir import Op
from bench.status import Unsupported, describe
from bench.subject import Subject

CONTROL_OPS = {"Loop", "If", "Scan"}


class OnnxPort:
    def __init__(self, subject: Subject):
        import onnxruntime as ort
        model_bytes, exporter = export(subject)
        control = sorted(_control_ops(model_bytes))
        self.info = {"exporter": exporter, "control_ops": control,
                     "note": f"{exporter}; {', '.join(control) or 'no control ops'}"}
        options = ort.SessionOptions()
        if subject.threads:
            options.intra_op_num_threads = subject.threads
        try:
            self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise Unsupported(f"onnxruntime cannot load the exported model: {describe(exc)}") from exc
        self.feed = _feed(self.session, subject)

    def run(self):
        return self.session.run(None, self.feed)


def export(subject: Subject) -> tuple[bytes, str]:
    """The model as ONNX bytes, with its control flow as Loop/If where it has any, and the
    name of the exporter that made it."""
    failures = []
    for name, exporter in (("TorchScript exporter", _export_scripted), ("dynamo exporter", _export_dynamo)):
        if exporter is _export_dynamo and _has_loops(subject):
            # torch.export keeps control flow only as torch.cond/while_loop and unrolls Python
            # loops; exporting 1000 unrolled steps takes many minutes only to be refused here.
            failures.append(f"{name}: not tried: it unrolls Python loops, so the export would have no Loop")
            continue
        try:
            with _quiet():
                model_bytes = exporter(subject)
        except Exception as exc:   # the exporter says why it cannot: that is the reason we record
            failures.append(f"{name}: {describe(exc.__cause__ or exc, 200)}")   # the cause says why
            continue
        if _needs_control_flow(subject) and not _control_ops(model_bytes):
            failures.append(f"{name}: the export has no Loop/If (control flow resolved for these inputs only)")
            continue
        return model_bytes, name
    raise Unsupported("; ".join(failures))


def _export_scripted(subject: Subject) -> bytes:
    scripted = torch.jit.script(subject.model)
    buffer = io.BytesIO()
    torch.onnx.export(scripted, subject.inputs, buffer, dynamo=False)
    return buffer.getvalue()


def _export_dynamo(subject: Subject) -> bytes:
    program = torch.onnx.export(subject.model, subject.inputs, dynamo=True, verbose=False)
    return program.model_proto.SerializeToString()


def _needs_control_flow(subject: Subject) -> bool:
    try:
        return subject.has_control_flow
    except Unsupported:   # cocktailer cannot tell: assume the model has control flow (all zoo models do)
        return True


def _has_loops(subject: Subject) -> bool:
    try:
        return any(op.op is Op.LOOP for op in subject.program.walk())
    except Unsupported:
        return False


def _control_ops(model_bytes: bytes) -> set[str]:
    import onnx
    model = onnx.load_from_string(model_bytes)
    found: set[str] = set()

    def walk(graph):
        for node in graph.node:
            if node.op_type in CONTROL_OPS:
                found.add(node.op_type)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)
    walk(model.graph)
    return found


def _feed(session, subject: Subject) -> dict:
    """Session inputs bound to the model's input tensors: by position when the exporter kept
    them all, else by the forward parameter name each one was named after."""
    names = [i.name for i in session.get_inputs()]
    arrays = [t.detach().cpu().numpy() for t in subject.tensors]
    if len(names) == len(arrays):
        return dict(zip(names, arrays))
    params = list(inspect.signature(subject.model.forward).parameters)
    by_param = {p: a for p, a in zip(params, subject.inputs) if isinstance(a, torch.Tensor)}
    feed = {}
    for name in names:
        base = re.sub(r"\.\d+$", "", name)
        if base not in by_param:
            raise Unsupported(f"cannot match ONNX input {name!r} to the model's inputs {params}")
        feed[name] = by_param[base].detach().cpu().numpy()
    return feed


@contextlib.contextmanager
def _quiet():
    """The exporters also print progress; the benchmark's output is its table."""
    from bench.runner import quiet   # runner imports the systems, which import this module
    with quiet(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield
