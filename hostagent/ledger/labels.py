"""Which gpupin labels are the container's own: a label equal to its image's is inherited (an image made by
`docker commit` of a pinned container carries that container's labels into every container made from it), so it
says nothing of this container: not pinned, not shared, not being started by a hostagent.

A container that hostagent pins writes every gpupin label itself (gpupin.hostagent.pin, `gpupin.shared=false`
included) and signs it with its lease's owner (gpupin.hostagent.ledger.lease): when the owner label is the
container's own, so are the others, even one that happens to equal the image's (a new run pinned to the card the
committed one had)."""

from __future__ import annotations

from gpupin.core.contract import LABEL_PREFIX
from gpupin.hostagent.ledger.lease import OWNER_LABEL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def gpupin_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(LABEL_PREFIX)}


def own(labels: Mapping[str, str], image_labels: Mapping[str, str]) -> dict[str, str]:
    """The container's labels without the gpupin labels it inherited from its image (`image_labels`)."""
    ours = gpupin_labels(labels)
    if not ours or not gpupin_labels(image_labels):
        return dict(labels)
    if OWNER_LABEL in ours and ours[OWNER_LABEL] != image_labels.get(OWNER_LABEL):
        return dict(labels)  # signed by the hostagent that made it, which wrote them all
    return {k: v for k, v in labels.items() if not (k in ours and image_labels.get(k) == v)}
