import subprocess, sys
cases = {
 "quant_noncontig": "torch.ops.fusekit.quant_i8(torch.randn(8,8,device='cuda').t(), 0.1, 0.0, -128, 127)",
 "quant_double": "torch.ops.fusekit.quant_i8(torch.randn(8,8,device='cuda').double(), 0.1, 0.0, -128, 127)",
 "ame_shape": "torch.ops.fusekit.add_mul_exp(torch.randn(8,8,device='cuda'), torch.randn(4,8,device='cuda'), 2.0)",
 "python_torch_check": "torch._C._nn.linear(torch.randn(3,4,device='cuda'), torch.randn(5,5,device='cuda'))",
}
for name, code in cases.items():
    for env in ({}, {"TORCH_DISABLE_ADDR2LINE": "1"}):
        r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", "import torch, fusion_backend; from fusion_backend import _ext; _ext.load_for_device()\ntry:\n    " + code + "\nexcept RuntimeError as e: print('RAISED', str(e)[:120].replace(chr(10),' '))"],
                           capture_output=True, text=True, env={**__import__('os').environ, **env})
        print(name, env, "rc", r.returncode, r.stdout.strip()[:200], r.stderr.strip()[-300:] if r.returncode else "")
