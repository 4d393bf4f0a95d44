"""The quantization core shared by ``int8`` and ``dynamic``: Q/DQ insertion and weight scales
(:mod:`.qdq`), the DynamicQuantizeLinear + MatMulInteger rewrite (:mod:`.dynamic`), lazily
smoothed weights (:mod:`.smooth`), and the calibration statistics (:mod:`.maths.calib`).
Never imports a pass."""
