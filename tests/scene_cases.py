"""The experiment of the scene picture and placement tests: a small DWFL run in the street canyon."""

#: A small street canyon run: 6 nodes, few rays, its traces cached in the test's folder.
SCENE_TOML = """
[run]
name = "scene-show"
algorithm = "dwfl"
seed = 1

[data]
dataset = "digits"
num_nodes = 6
samples_per_node = 20

[model]
kind = "logistic"

[dwfl]
scheme = "ota_d2d"
rounds = 2
batch = 8
lr = 0.5
gmax = 1.0
epsilon = 5.0
power_dbm = 20.0
noise_figure_db = 7.0
bandwidth_hz = 1e6
carrier_hz = 3.5e9
fading = "none"
pathloss = "scene"

[dwfl.scene]
name = "simple_street_canyon"
max_depth = 2
samples_per_source = 2000
cache_dir = "{cache}"

[topology]
kind = "random_geometric"
snr_threshold_db = 10.0
allow_disconnected = true

[output]
figures = false
"""
