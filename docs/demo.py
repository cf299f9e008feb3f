"""The main job: trace ResNet-18 on one image, print what was recorded, draw it, check it."""

import torch
import torchvision

import torchlens as tl

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
adds = [op.label for op in trace.ops if "add" in op.func_name]
print(f"  {len(adds)} residual adds, none a module output: {adds[:3]} ...")
print("\nEverything recorded about one op:")
print(trace["conv2d_3"])

# The picture in the README: top-level blocks as boxes where the full graph would be too big.
picture = trace.draw("docs/images/resnet18", collapse="auto", file_format="svg")
print(f"\nDrew {picture} (full graph: trace.draw(); one block: trace.draw(module='layer2'))")
print()
report = trace.audit()
print(report)
raise SystemExit(0 if report else 1)
