module gpu-extender/bench/floor

go 1.22
