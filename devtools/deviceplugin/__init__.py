"""Device-plugin doubles that a real kubelet calls: gpushare's and HAMi's plugins as the node's side of the two
device protocols the extender speaks (DESIGN §9), over kubelet's device-plugin gRPC API v1beta1, with the GPUs a
YAML file describes and a JSON-lines record of every Allocate. `python -m devtools.deviceplugin --help`.

Each rule is read from the real plugin's code at a pinned commit and cited beside it. Nothing here may import
`extender`: the doubles are written independently, so they check the extender against a second reading.
"""
