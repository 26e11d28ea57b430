"""Running programs on more than one device, and on more than one process."""
from progdesc.distributed.multihost import (global_batch, initialize, load_checkpoint_shards,
                                            save_checkpoint, save_checkpoint_shards, to_host)
