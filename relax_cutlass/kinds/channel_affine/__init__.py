"""The channel-affine kind: act(batch_norm(concat(parts))) over NHWC channels (DenseNet's
pre-activation BN-ReLU on the concatenation of every earlier layer's output) as one CUDA kernel."""
