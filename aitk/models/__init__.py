"""Model archs: the BaseModel contract (base.py), the registry, the built-in archs."""

import logging

# torchao (the uint/int8/float8 qtypes) announces at import, on every run, that its CUDA
# kernels do not load on a CPU build and that diffusers cannot find the tensor classes
# of older torchao releases; torch adds a deprecation line per torchao enum. None of it
# concerns a trainer that uses torchao's weight-only configs; real errors still show.
for _name in ("torchao", "diffusers.quantizers.torchao.torchao_quantizer",
              "torch.utils._pytree"):
    logging.getLogger(_name).setLevel(logging.ERROR)
