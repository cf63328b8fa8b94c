import numpy as np

import maxinstr

w = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
with maxinstr.session("runs/quickstart", warmup=2):  # writes the run directory
    for request in range(5):  # the first 2 requests are warm-up, prefill and decode steps alike
        with maxinstr.stage("prefill", request=request):
            x = np.ones((64, 1024), np.float32) @ w
        for step in range(8):
            with maxinstr.stage("decode", step=step):  # on a GPU: stream=<your stream>
                x = np.tanh(x[-1:] @ w)
                with maxinstr.stage("sample"):
                    token = int(x.argmax())
