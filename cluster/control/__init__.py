"""The control layer (paper 000 §5, App. E.3): what the control plane knows of the nodes,
routers, planners and the `ControlPlane` that drives simulated and live engines alike."""
