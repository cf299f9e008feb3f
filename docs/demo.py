"""The main job: trace ResNet-18 on one image, print what was recorded, draw it, check it.

    python docs/demo.py                    # the drawing goes to a fresh temporary folder
    python docs/demo.py --out docs/images  # refresh the README's picture (docs/images/resnet18.svg)

Without Graphviz's ``dot`` the demo writes the DOT source instead of the picture,
says how to get the picture, and still prints everything else and the audit.
"""

import argparse
import os
import tempfile

import torch
import torchvision

import torchlens as tl
from torchlens_core.ir import GraphvizNotFoundError

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", default=None, help="folder for the drawing (default: a new temporary folder)")
options = parser.parse_args()
out = options.out or tempfile.mkdtemp(prefix="torchlens-demo-")
os.makedirs(out, exist_ok=True)

torch.manual_seed(0)
model = torchvision.models.resnet18(weights=None).eval()
x = torch.rand(1, 3, 224, 224)

trace = tl.trace(model, x)
print(trace)
print(trace.summary())

print("\nA few lookups:")
print("  trace['layer3'].out.shape     ", tuple(trace["layer3"].out.shape))
print("  trace['conv2d_3'].label       ", trace["conv2d_3"].label)
print("  trace[7].func_name            ", trace[7].func_name)
print("  trace['relu_1'].modules       ", trace["relu_1"].modules)
print("  trace.flops, trace.macs       ", trace.flops, trace.macs)
adds = [op.label for op in trace.ops if "add" in op.func_name]
print(f"  {len(adds)} residual adds, none a module output: {adds[:3]} ...")
print("\nEverything recorded about one op:")
print(trace["conv2d_3"])

# The picture in the README: top-level blocks as boxes where the full graph would be too big.
picture = os.path.join(out, "resnet18")
try:
    drawn = trace.draw(picture, collapse="auto", file_format="svg")
    print(f"\nDrew {drawn} (full graph: trace.draw(); one block: trace.draw(module='layer2'))")
except GraphvizNotFoundError:
    with open(picture + ".dot", "w") as f:
        f.write(trace.to_dot(collapse="auto"))
    print(
        f"\nNo picture: drawing needs Graphviz's 'dot' program, which is not on PATH. Install Graphviz "
        f"(apt-get install graphviz, brew install graphviz or conda install graphviz) and run the demo again, "
        f"or render the DOT source written to {picture}.dot with `dot -Tsvg {picture}.dot -o {picture}.svg`."
    )
print()
report = trace.audit()
print(report)
raise SystemExit(0 if report else 1)
