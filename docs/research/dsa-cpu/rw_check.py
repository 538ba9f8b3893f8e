import re, torch
src = open("/tmp/dsa-research/vllm_probe2.py").read()
ns = {"torch": torch, "FP8": torch.float8_e4m3fn}
for name in ("write_k", "read_k"):
    m = re.search(r"    def %s\(.*?(?=\n    def )" % name, src, re.S)
    exec("\n".join(l[4:] for l in m.group(0).splitlines()), ns)
torch.manual_seed(0)
nb, bs, hd = 5, 64, 128
backing = torch.zeros(nb, 2 * bs, 132, dtype=torch.uint8); cache = backing[:, :bs]
k = torch.randn(100, hd)
bt = torch.tensor([3, 1], dtype=torch.int32)
slots = torch.cat([bt[p // bs].long() * bs + p % bs for p in [torch.arange(100)]])
ns["write_k"](k, cache, slots, 128)
back = ns["read_k"](cache, bt, 100, hd, 128)
print("roundtrip max rel err", ((back - k).abs().max() / k.abs().max()).item())
