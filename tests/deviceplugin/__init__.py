"""Tests of the device-plugin doubles that a real kubelet calls (devtools/deviceplugin/)."""
