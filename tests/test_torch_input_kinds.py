"""Complex, sparse and meta tensors through capture and audit."""

import pytest

torch = pytest.importorskip("torch")

import torchlens as tl  # noqa: E402
from torchlens_core.ir.errors import UnsupportedError  # noqa: E402
from torchlens_torch.arrays import array_error  # noqa: E402


def double_sum(x):
    return (x * 2).sum()


def test_complex_values_are_compared_in_both_parts():
    a = torch.tensor([1 + 1j, 2 + 0j])
    assert array_error(a, a.clone()) == 0.0
    assert array_error(a, torch.tensor([1 + 1j, 2 + 5j])) > 0.5  # only the imaginary part differs
    trace = tl.trace(double_sum, torch.randn(3, dtype=torch.complex64))
    assert trace.audit()
    trace.ops[1].out = trace.ops[1].out + 1j  # a corrupted imaginary part must fail the audit
    assert not trace.audit()


def test_sparse_inputs_are_audited_by_value():
    x = torch.randn(4, 4).to_sparse()
    trace = tl.trace(double_sum, x)
    assert trace.audit() and torch.allclose(trace.output, x.to_dense().sum() * 2)


def test_meta_tensors_have_no_values_to_audit():
    trace = tl.trace(double_sum, torch.randn(4, 4, device="meta"))
    assert trace.output.shape == () and trace.output.is_meta
    with pytest.raises(UnsupportedError, match="meta tensors hold no values"):
        trace.audit()


def test_a_packed_sequence_through_an_lstm():
    from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

    class Packed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 4, batch_first=True)

        def forward(self, x, lengths):
            out, (h, _) = self.lstm(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
            return pad_packed_sequence(out, batch_first=True)[0], h

    model, x, lengths = Packed(), torch.randn(2, 5, 3), torch.tensor([5, 3])
    trace = tl.trace(model, x, lengths)
    with torch.no_grad():
        padded, h = model(x, lengths)
    assert torch.equal(trace.output[0], padded) and torch.equal(trace.output[1], h)
    returned = trace["lstm"].out[0]
    assert isinstance(returned, PackedSequence) and torch.equal(returned.batch_sizes, torch.tensor([2, 2, 2, 1, 1]))
    assert trace.audit()


@pytest.mark.parametrize("transform", ["vmap", "grad", "operator"])
def test_torch_func_transforms_inside_the_forward(transform):
    # vmap and grad are recorded as one op each (tests/test_torch_func_transforms.py); functionalize is not, and
    # its ops are refused, here from inside a tensor operator, which turns a TypeError into NotImplemented
    def batched(x):
        return torch.func.vmap(lambda row: torch.sin(row) * 2)(x)

    def operator(x):
        return torch.func.functionalize(lambda row: row + row)(x)

    def gradient(x):
        return torch.func.grad(lambda row: torch.sin(row).sum())(x)

    model = {"vmap": batched, "grad": gradient, "operator": operator}[transform]
    x = torch.randn(3) if transform == "grad" else torch.randn(3, 4)
    if transform == "operator":
        with pytest.raises(UnsupportedError, match="torch.func transform"):
            tl.trace(model, x)
    else:
        trace = tl.trace(model, x)
        assert torch.equal(trace.output, model(x)) and trace.audit()
    assert torch._C._functorch.peek_interpreter_stack() is None  # the transform unwound
    assert tl.trace(lambda x: torch.sin(x) * 2, torch.randn(3)).audit()  # and capture works after it
