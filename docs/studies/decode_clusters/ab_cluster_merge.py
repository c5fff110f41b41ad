"""bench decode --shapes with the cluster merge off (CLUSTERS = (): decode_merge) or on, same plans."""
import sys, types
from pykda.ops import decode
if sys.argv[1] == "off":
    decode.CLUSTERS = ()
from pykda.bench import decode as bd
shapes = ("32/32:8192,16/16:8192,32/8:4096,32/4:1000:64,16/16:100003:64,32/32:65536,32/32:12345:256,"
          "8x32/8:32768,16x32/32:8191~,16x64/8:16384~,32x32/8:8192~:64,64x32/8:8192~")
args = types.SimpleNamespace(quick=False, shapes=shapes, grid=False, chunk_size=None, stages=None, plot=None, flush="read")
bd.run(args)
