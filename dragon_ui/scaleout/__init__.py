"""Training the same run on several GPUs or a cluster: the self-contained launch folder (launch_folder), the helpers a
run uses when accelerate or torchrun started it (distributed), and the accelerate configs per strategy."""
