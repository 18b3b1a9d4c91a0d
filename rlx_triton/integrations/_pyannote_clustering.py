"""Speaker clustering of a pyannote.audio SpeakerDiarization pipeline in torch, in memory linear in the embeddings.

pyannote.audio (4.x) clusters the (chunk, local speaker) embeddings on the host with scipy: `linkage(...,
method="centroid")` first builds the condensed matrix of all pairwise distances, N * (N - 1) / 2 float64
values for N embeddings (up to 3 per chunk, one chunk per second at pyannote's default step: an estimate of
about 10,000 embeddings and 400 MB for an hour of audio, 40 GB for ten hours), then merges with Lance-Williams
updates.
`cluster(...)` computes the same clustering, on the device the pipeline's embedding model is on:

- `centroid_linkage` keeps one centroid per cluster and each cluster's nearest neighbour instead of the
  matrix: every merge measures the new centroid against the live ones (one matrix-vector product) and
  re-searches only the clusters whose neighbour was one of the two merged. Centroid linkage's distance
  between two clusters is the distance between their centroids, which is what scipy's Lance-Williams
  update computes, so the merges, their order and the dendrogram (scipy's layout: ids, distance, size per
  row) are scipy's, up to float64 rounding. Memory: the embeddings and a few vectors of N.
- the flat clusters, the minimum cluster size and the search for a requested number of clusters follow
  AgglomerativeClustering (scipy's `fcluster` runs on the dendrogram, which is linear in N);
- VBx (pyannote.audio.utils.vbx) runs its iterations in torch (float64), after the PLDA transform (the
  pipeline's own PLDA object, numpy); its optional K-Means re-clustering is scikit-learn's, as in the stock
  pipeline;
- the assignment of every embedding to its closest centroid (cosine) runs in torch; the constrained
  assignment (one Hungarian problem per chunk, scipy) stays on the host.

The float32 steps of the stock code stay float32 (the normalisation of the embeddings before the linkage), so
the linkage sees the same points. Other clustering methods (K-Means, oracle, agglomerative linkages other
than "centroid") are left to the pipeline's own clustering object (`supported(clustering)` says which).
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Optional, Tuple

import numpy as np
import torch

# rows of the pairwise-distance block computed at once when every cluster's nearest neighbour is searched
NEIGHBOUR_BLOCK_ROWS = 256
# a live-cluster table is compacted once at most this share of its rows is still live
COMPACT_BELOW = 0.5


def supported(clustering) -> bool:
    """Whether `cluster` computes this clustering object's result: pyannote's VBxClustering, or its
    AgglomerativeClustering with the "centroid" linkage (the default of pyannote's pretrained pipelines)."""
    name = type(clustering).__name__
    if name == "VBxClustering":
        return all(hasattr(clustering, attribute) for attribute in ("plda", "threshold", "Fa", "Fb"))
    if name == "AgglomerativeClustering":
        return getattr(clustering, "method", None) == "centroid" and \
            getattr(clustering, "metric", None) in ("cosine", "euclidean")
    return False


# ---------------------------------------------------------------------------------------------
# centroid linkage
# ---------------------------------------------------------------------------------------------
class _LiveClusters:
    """The live clusters during a centroid linkage: member sums and centroids (torch, on the linkage's device),
    and on the host each cluster's size, dendrogram id and nearest live neighbour (row, distance bound); rows
    are compacted as clusters merge away. The per-merge bookkeeping is a few numpy operations on vectors
    of the live count; the device does the products."""

    def __init__(self, points: torch.Tensor):
        n = points.shape[0]
        self.sums = points.clone()
        self.centroids = points.clone()
        self.squares = (points * points).sum(1)
        self.sizes = np.ones(n)
        self.ids = np.arange(n)
        self.live = np.ones(n, dtype=bool)
        self.live_count = n
        self.neighbour = np.zeros(n, dtype=np.int64)
        self.distance = np.full(n, np.inf)   # a lower bound of the distance to the nearest live neighbour
        self.confirmed = np.zeros(n, dtype=bool)  # whether `distance` is the distance to `neighbour`, the nearest
        self.search(np.arange(n))

    def distances_to(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), clusters) distances from the centroids of `rows` to every centroid (inf for dead
        clusters and for a row itself): squared norms minus twice the products, a matrix product that only
        ranks the candidates (`exact` gives the distance of the one chosen)."""
        index = torch.as_tensor(rows, device=self.centroids.device)
        squared = self.squares[index][:, None] + self.squares[None] - 2.0 * (self.centroids[index] @ self.centroids.T)
        distances = squared.clamp_min_(0.0).sqrt_().cpu().numpy()
        distances[:, ~self.live] = np.inf
        distances[np.arange(len(rows)), rows] = np.inf
        return distances

    def exact(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Distances between the centroids of rows a and b from their differences, as scipy's pdist computes
        a distance."""
        device = self.centroids.device
        difference = self.centroids[torch.as_tensor(a, device=device)] - self.centroids[torch.as_tensor(b, device=device)]
        return (difference * difference).sum(-1).sqrt().cpu().numpy()

    def search(self, rows: np.ndarray) -> None:
        """The nearest live neighbour of each of `rows`, in blocks of rows."""
        for start in range(0, len(rows), NEIGHBOUR_BLOCK_ROWS):
            block = rows[start:start + NEIGHBOUR_BLOCK_ROWS]
            nearest = self.distances_to(block).argmin(1)
            self.neighbour[block] = nearest
            self.distance[block] = self.exact(block, nearest)
            self.confirmed[block] = True

    def closest_pair(self) -> Tuple[int, int, float]:
        """The two live clusters whose centroids are closest: the cluster with the smallest bound is taken
        once its neighbour is confirmed (searched again while the bound is only a lower bound)."""
        while True:
            first = int(np.argmin(self.distance))
            if self.confirmed[first]:
                break
            self.search(np.array([first]))
        second = int(self.neighbour[first])
        return min(first, second), max(first, second), float(self.distance[first])

    def merge(self, a: int, b: int, new_id: int) -> None:
        """Cluster b becomes the union of a and b (id new_id); a dies; the neighbour bounds are kept valid.

        Each cluster's `distance` stays a lower bound of its distance to its nearest live neighbour: merging
        only removes a and changes b, so a bound can only fall through the new b, which is measured against
        every live cluster. A cluster whose neighbour was a or b keeps its bound, unconfirmed (its neighbour
        is searched again if it ever holds the smallest bound), as in scipy's generic algorithm."""
        self.sums[b] += self.sums[a]
        self.sizes[b] += self.sizes[a]
        self.centroids[b] = self.sums[b] / self.sizes[b]
        self.squares[b] = (self.centroids[b] * self.centroids[b]).sum()
        self.ids[b] = new_id
        self.live[a] = False
        self.live_count -= 1
        self.distance[a] = np.inf
        self.confirmed[a] = True
        if self.live_count < 2:
            return
        to_new = self.distances_to(np.array([b]))[0]
        moved = self.live & ((self.neighbour == a) | (self.neighbour == b))
        self.neighbour[moved] = b
        self.confirmed[moved] = False
        closer = np.flatnonzero(self.live & (to_new < self.distance))
        if len(closer):
            self.neighbour[closer] = b
            self.distance[closer] = self.exact(closer, np.full_like(closer, b))
            self.confirmed[closer] = True
        nearest = int(np.argmin(to_new))
        self.neighbour[b] = nearest
        self.distance[b] = self.exact(np.array([b]), np.array([nearest]))[0]
        self.confirmed[b] = True
        if self.live_count <= COMPACT_BELOW * len(self.ids) and len(self.ids) > NEIGHBOUR_BLOCK_ROWS:
            self.compact()

    def compact(self) -> None:
        """Drops the dead rows (neighbour rows renumbered), so each merge's work shrinks with the live count."""
        keep = np.flatnonzero(self.live)
        renumber = np.full(len(self.ids), -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        index = torch.as_tensor(keep, device=self.centroids.device)
        self.sums, self.centroids, self.squares = self.sums[index], self.centroids[index], self.squares[index]
        self.sizes, self.ids = self.sizes[keep], self.ids[keep]
        self.neighbour = renumber[self.neighbour[keep]]
        self.distance, self.confirmed = self.distance[keep], self.confirmed[keep]
        self.live = np.ones(len(keep), dtype=bool)


def centroid_linkage(points, device: Optional[torch.device] = None) -> np.ndarray:
    """scipy.cluster.hierarchy.linkage(points, method="centroid", metric="euclidean") without the distance
    matrix: the (N - 1, 4) float64 dendrogram (smaller id, larger id, distance, size per merge, in merge
    order) computed in float64 on `device` (default: where `points` is, the CPU for a numpy array).

    Each merge joins the two live clusters whose centroids are closest, as scipy's generic algorithm does;
    the distances are the Euclidean distances between those centroids (scipy reaches them through Lance-Williams
    updates), so they agree to float64 rounding. Memory: O(N * dimension).

    Example:
        >>> import numpy as np
        >>> centroid_linkage(np.array([[0.0, 0.0], [0.0, 1.0], [5.0, 0.5]])).round(3).tolist()
        [[0.0, 1.0, 1.0, 2.0], [2.0, 3.0, 5.0, 3.0]]
    """
    tensor = torch.as_tensor(points)
    if tensor.dim() != 2 or tensor.shape[0] < 2:
        raise ValueError(f"centroid_linkage: points must be (N >= 2, dimension), got shape {tuple(tensor.shape)}")
    tensor = tensor.to(device=device if device is not None else tensor.device, dtype=torch.float64)
    if not bool(torch.isfinite(tensor).all()):
        raise ValueError("centroid_linkage: points must be finite (a zero-norm embedding normalises to NaN)")
    n = tensor.shape[0]
    dendrogram = np.empty((n - 1, 4), dtype=np.float64)
    with _one_thread_on_cpu(tensor.device):
        clusters = _LiveClusters(tensor)
        for k in range(n - 1):
            a, b, distance = clusters.closest_pair()
            id_a, id_b = int(clusters.ids[a]), int(clusters.ids[b])
            size = clusters.sizes[a] + clusters.sizes[b]
            dendrogram[k] = (min(id_a, id_b), max(id_a, id_b), distance, size)
            clusters.merge(a, b, n + k)
    return dendrogram


@contextlib.contextmanager
def _one_thread_on_cpu(device: torch.device) -> Iterator[None]:
    """torch's intra-op threads limited to one while the linkage runs on the CPU: each merge is a few
    operations on vectors of the live count, where more threads only add their start-up and barrier costs
    (measured: 13 s instead of 1 s for 1,500 embeddings on a 2-core machine that other jobs share)."""
    saved = torch.get_num_threads()
    if device.type != "cpu" or saved == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


# ---------------------------------------------------------------------------------------------
# the steps around the linkage, as pyannote's clustering objects define them
# ---------------------------------------------------------------------------------------------
def _device(device) -> torch.device:
    return torch.device(device) if device is not None else torch.device("cpu")


def active_embeddings(embeddings: np.ndarray, segmentations: np.ndarray,
                      min_active_ratio: float = 0.2) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(embeddings, chunk indices, speaker indices) of the (chunk, speaker) pairs that clustering trains on:
    a finite embedding, and at least `min_active_ratio` of the chunk's frames where that speaker alone speaks
    (BaseClustering.filter_embeddings)."""
    num_frames = segmentations.shape[1]
    alone = np.sum(segmentations, axis=2, keepdims=True) == 1
    clean_frames = np.sum(segmentations * alone, axis=1)
    keep = (clean_frames >= min_active_ratio * num_frames) & ~np.any(np.isnan(embeddings), axis=2)
    chunk_idx, speaker_idx = np.where(keep)
    return embeddings[chunk_idx, speaker_idx], chunk_idx, speaker_idx


def _cosine_scores(embeddings: np.ndarray, centroids: np.ndarray, device: torch.device) -> np.ndarray:
    """(chunks, speakers, clusters) 2 - cosine distance between every embedding and every centroid, in
    float64 on `device` (NaN for NaN embeddings, as scipy's cdist gives)."""
    chunks, speakers, dimension = embeddings.shape
    rows = torch.as_tensor(embeddings.reshape(-1, dimension), device=device).to(torch.float64)
    columns = torch.as_tensor(centroids, device=device).to(torch.float64)
    dot = rows @ columns.T
    norms = rows.norm(dim=1, keepdim=True) * columns.norm(dim=1)[None]
    return (1.0 + dot / norms).cpu().numpy().reshape(chunks, speakers, -1)


def _metric_scores(embeddings: np.ndarray, centroids: np.ndarray, metric: str, device: torch.device) -> np.ndarray:
    if metric == "cosine":
        return _cosine_scores(embeddings, centroids, device)
    from scipy.spatial.distance import cdist

    chunks, speakers, dimension = embeddings.shape
    return 2 - cdist(embeddings.reshape(-1, dimension), centroids, metric=metric).reshape(chunks, speakers, -1)


def _hungarian(scores: np.ndarray) -> np.ndarray:
    """(chunks, speakers) int8 clusters: per chunk, the one-to-one speaker -> cluster assignment of highest total
    score (speakers left without a cluster get -2), NaN scores counting as the lowest score."""
    from scipy.optimize import linear_sum_assignment

    scores = np.nan_to_num(scores, nan=np.nanmin(scores))
    hard = np.full(scores.shape[:2], -2, dtype=np.int8)
    for c, chunk in enumerate(scores):
        speakers, clusters = linear_sum_assignment(chunk, maximize=True)
        hard[c, speakers] = clusters
    return hard


def _single_cluster(embeddings: np.ndarray, train: np.ndarray):
    chunks, speakers, _ = embeddings.shape
    return (np.zeros((chunks, speakers), dtype=np.int8), np.ones((chunks, speakers, 1)),
            np.mean(train, axis=0, keepdims=True))


def _flat(dendrogram: np.ndarray, threshold: float) -> np.ndarray:
    from scipy.cluster.hierarchy import fcluster

    return fcluster(dendrogram, threshold, criterion="distance") - 1


def _large(clusters: np.ndarray, min_cluster_size: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    values, counts = np.unique(clusters, return_counts=True)
    return values, counts, values[counts >= min_cluster_size]


def _agglomerative_clusters(clustering, points: np.ndarray, min_clusters: int, max_clusters: int,
                            num_clusters: Optional[int], device: torch.device) -> np.ndarray:
    """AgglomerativeClustering.cluster with the centroid linkage: flat clusters at the threshold, the number of
    large clusters brought within [min_clusters, max_clusters] (or to num_clusters) by cutting the dendrogram
    at another merge, and the small clusters joined to the large one with the closest centroid."""
    from scipy.spatial.distance import cdist

    n = points.shape[0]
    min_cluster_size = min(int(clustering.min_cluster_size), max(1, round(0.1 * n)))
    if n == 1:
        return np.zeros((1,), dtype=np.uint8)
    if clustering.metric == "cosine":
        with np.errstate(divide="ignore", invalid="ignore"):
            points = points / np.linalg.norm(points, axis=-1, keepdims=True)   # float32, as the stock code
    dendrogram = centroid_linkage(points, device=device)
    clusters = _flat(dendrogram, clustering.threshold)
    values, counts, large = _large(clusters, min_cluster_size)
    if len(large) < min_clusters:
        num_clusters = min_clusters
    elif len(large) > max_clusters:
        num_clusters = max_clusters
    if num_clusters is not None and len(large) != num_clusters:
        # cut after another merge: the merge index replaces the distance, merges tried from the one whose
        # distance is closest to the threshold outwards, until the count of large clusters is the target
        by_index = dendrogram.copy()
        by_index[:, 2] = np.arange(n - 1)
        best, best_count = n - 1, 1
        for merge in np.argsort(np.abs(dendrogram[:, 2] - clustering.threshold)):
            if by_index[merge, 3] < min_cluster_size:
                continue
            clusters = _flat(by_index, merge)
            values, counts, large = _large(clusters, min_cluster_size)
            if abs(len(large) - num_clusters) < abs(best_count - num_clusters):
                best, best_count = merge, len(large)
            if len(large) == num_clusters:
                break
        if best_count != num_clusters:
            clusters = _flat(by_index, best)
            values, counts, large = _large(clusters, min_cluster_size)
            warnings.warn(f"Found only {len(large)} clusters. Using a smaller value than {min_cluster_size} "
                          f"for `min_cluster_size` might help.")
    if len(large) == 0:
        clusters[:] = 0
        return clusters
    small = values[counts < min_cluster_size]
    if len(small) == 0:
        return clusters
    large_centroids = np.vstack([np.mean(points[clusters == k], axis=0) for k in large])
    small_centroids = np.vstack([np.mean(points[clusters == k], axis=0) for k in small])
    closest = np.argmin(cdist(large_centroids, small_centroids, metric=clustering.metric), axis=0)
    for s, l in enumerate(closest):
        clusters[clusters == small[s]] = large[l]
    return np.unique(clusters, return_inverse=True)[1]


def _agglomerative(clustering, embeddings, segmentations, num_clusters, min_clusters, max_clusters, device):
    train, chunk_idx, speaker_idx = active_embeddings(embeddings, segmentations)
    num_clusters, min_clusters, max_clusters = clustering.set_num_clusters(
        train.shape[0], num_clusters=num_clusters, min_clusters=min_clusters, max_clusters=max_clusters)
    if max_clusters < 2:
        return _single_cluster(embeddings, train)
    train_clusters = _agglomerative_clusters(clustering, train.copy(), min_clusters, max_clusters, num_clusters,
                                             device)
    centroids = np.vstack([np.mean(train[train_clusters == k], axis=0) for k in range(np.max(train_clusters) + 1)])
    scores = _metric_scores(embeddings, centroids, clustering.metric, device)
    hard = _hungarian(scores) if clustering.constrained_assignment else np.argmax(scores, axis=2)
    return hard, scores, centroids


def vbx(features: torch.Tensor, phi: torch.Tensor, initial: np.ndarray, fa: float, fb: float,
        max_iterations: int = 20, smoothing: float = 7.0, epsilon: float = 1e-4) -> Tuple[torch.Tensor, torch.Tensor]:
    """pyannote.audio.utils.vbx.cluster_vbx in torch: (responsibilities (N, S), speaker priors (S,)) of the VBx
    model (PLDA features, the diagonal across-class covariance phi) started from the AHC clusters `initial`
    (softened one-hot rows), iterated until the ELBO improves by less than epsilon."""
    n, dimension = features.shape
    speakers = int(initial.max()) + 1
    one_hot = torch.zeros((n, speakers), dtype=torch.float64, device=features.device)
    one_hot[torch.arange(n), torch.as_tensor(initial.astype(np.int64), device=features.device)] = 1.0
    gamma = torch.softmax(one_hot * smoothing, dim=1) if smoothing >= 0 else one_hot
    prior = torch.full((speakers,), 1.0 / speakers, dtype=torch.float64, device=features.device)
    constant = -0.5 * ((features * features).sum(1, keepdim=True) + dimension * np.log(2 * np.pi))
    rho = features * phi.sqrt()
    previous = None
    for _ in range(max_iterations):
        inv_l = 1.0 / (1 + fa / fb * gamma.sum(0, keepdim=True).T * phi)          # (S, D)
        alpha = fa / fb * inv_l * (gamma.T @ rho)
        log_p = fa * (rho @ alpha.T - 0.5 * (inv_l + alpha ** 2) @ phi + constant)
        log_prior = torch.log(prior + 1e-8)
        log_px = torch.logsumexp(log_p + log_prior, dim=-1)
        gamma = torch.exp(log_p + log_prior - log_px[:, None])
        prior = gamma.sum(0)
        prior = prior / prior.sum()
        elbo = float(log_px.sum() + fb * 0.5 * torch.sum(torch.log(inv_l) - inv_l - alpha ** 2 + 1))
        if previous is not None and elbo - previous < epsilon:
            break
        previous = elbo
    return gamma, prior


def _vbx(clustering, embeddings, segmentations, num_clusters, min_clusters, max_clusters, device):
    train, _, _ = active_embeddings(embeddings, segmentations)
    if train.shape[0] < 2:
        return _single_cluster(embeddings, train)
    normed = train / np.linalg.norm(train, axis=1, keepdims=True)     # float32, as the stock code
    ahc = np.unique(_flat(centroid_linkage(normed, device=device), clustering.threshold), return_inverse=True)[1]
    features = torch.as_tensor(clustering.plda(train), device=device).to(torch.float64)
    phi = torch.as_tensor(np.ascontiguousarray(clustering.plda.phi), device=device).to(torch.float64)
    gamma, prior = vbx(features, phi, ahc, float(clustering.Fa), float(clustering.Fb))
    kept = gamma[:, prior > 1e-7]
    train64 = torch.as_tensor(train, device=device).to(torch.float64)
    centroids = (kept.T @ train64 / kept.sum(0, keepdim=True).T).cpu().numpy()
    constrained = clustering.constrained_assignment
    found = centroids.shape[0]
    if found < min_clusters:
        num_clusters = min_clusters
    elif found > max_clusters:
        num_clusters = max_clusters
    if num_clusters and num_clusters != found:
        from sklearn.cluster import KMeans

        constrained = False   # forcing a count: a constrained assignment could add clusters back
        labels = KMeans(n_clusters=num_clusters, n_init=3, random_state=42, copy_x=False).fit_predict(normed)
        centroids = np.vstack([np.mean(train[labels == k], axis=0) for k in range(num_clusters)])
    scores = _metric_scores(embeddings, centroids, clustering.metric, device)
    if constrained:
        scores[segmentations.sum(1) == 0] = scores.min() - 1.0   # below any real score: silent speakers last
        hard = _hungarian(scores)
    else:
        hard = np.argmax(scores, axis=2)
    return hard.reshape(embeddings.shape[:2]), scores, centroids


def cluster(clustering, embeddings: np.ndarray, segmentations, num_clusters: Optional[int] = None,
            min_clusters: Optional[int] = None, max_clusters: Optional[float] = None,
            device: Any = None) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hard_clusters (chunks, speakers), soft_clusters (chunks, speakers, clusters), centroids) of
    `clustering(embeddings=..., segmentations=..., num_clusters=..., min_clusters=..., max_clusters=...)` for
    a clustering object `supported` accepts, computed as the module docstring says, on `device`.

    embeddings: (chunks, speakers, dimension) float32; segmentations: the binarized segmentations (a
    pyannote SlidingWindowFeature or its (chunks, frames, speakers) data)."""
    if not supported(clustering):
        raise TypeError(f"cluster: clustering must be pyannote's VBxClustering or AgglomerativeClustering with the "
                        f"centroid method, got {type(clustering).__name__}")
    data = getattr(segmentations, "data", segmentations)
    min_clusters = 1 if min_clusters is None else min_clusters          # SpeakerDiarization's defaults
    max_clusters = np.inf if max_clusters is None else max_clusters
    run = _vbx if type(clustering).__name__ == "VBxClustering" else _agglomerative
    return run(clustering, embeddings, np.asarray(data), num_clusters, min_clusters, max_clusters, _device(device))


__all__ = ["active_embeddings", "centroid_linkage", "cluster", "supported", "vbx"]
