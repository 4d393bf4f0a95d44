"""The detection decode, NMS and 'detections kept' metric of ``benchmarks/tasks.py``, on boxes
made by hand whose answers can be worked out on paper.

``benchmarks/`` is a folder of scripts, not a package: ``tasks`` (and ``inputs``, for its
letterbox) are imported from their files with the folder on ``sys.path`` for the duration of the
module, as ``tests/real/test_benchmark_inputs.py`` does. No model is needed.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def tasks():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("tasks")
    finally:
        sys.path.remove(str(BENCH))


def dets(tasks, boxes, scores, classes):
    return tasks.Detections(np.array(boxes, np.float32).reshape(-1, 4), np.array(scores, np.float32),
                            np.array(classes, np.int64))


def test_box_iou_by_hand(tasks):
    a = np.array([[0, 0, 2, 2], [0, 0, 2, 2]], np.float32)
    b = np.array([[0, 0, 2, 2], [1, 0, 3, 2], [5, 5, 6, 6], [3, 3, 3, 3]], np.float32)
    iou = tasks.box_iou(a, b)
    assert iou.shape == (2, 4)
    np.testing.assert_allclose(iou[0], [1.0, 2 / 6, 0.0, 0.0])  # inter 2, union 4 + 4 − 2
    assert np.array_equal(iou[0], iou[1])


def test_nms_keeps_the_best_and_drops_overlaps_above_the_threshold(tasks):
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 9]], np.float32)
    scores = np.array([0.8, 0.9, 0.7, 0.6], np.float32)
    # box 1 is best; box 0 overlaps it with IoU 90/110 = 0.82, box 3 with 81/109 = 0.74
    assert tasks.nms(boxes, scores, 0.45).tolist() == [1, 2]
    assert tasks.nms(boxes, scores, 0.8).tolist() == [1, 2, 3]
    assert tasks.nms(boxes, scores, 0.9).tolist() == [1, 0, 2, 3]
    assert tasks.nms(boxes, scores, 0.9, keep=2).tolist() == [1, 0]
    assert tasks.nms(boxes, scores, 0.9, candidates=2).tolist() == [1, 0]
    assert tasks.nms(boxes[:0], scores[:0], 0.5).tolist() == []


def _yolo_head(columns):
    """[1, 4 + C, N] from a list of (cx, cy, w, h, p_0, ..., p_C-1) columns."""
    return np.array(columns, np.float32).T[None]


def test_yolo_decode_threshold_class_agnostic_nms_and_letterbox(tasks):
    head = _yolo_head([(5, 5, 10, 10, 0.9, 0.1),     # class 0 at (0, 0, 10, 10)
                       (6, 5, 10, 10, 0.2, 0.8),     # class 1, IoU 0.82 with the first: suppressed across classes
                       (25, 25, 10, 10, 0.1, 0.05),  # below the threshold
                       (40, 40, 4, 8, 0.3, 0.6)])    # class 1 at (38, 36, 42, 44)
    found = tasks.yolo_detections(head, conf=0.25, iou=0.45)
    assert found.classes.tolist() == [0, 1]
    np.testing.assert_allclose(found.scores, [0.9, 0.6])
    np.testing.assert_allclose(found.boxes, [[0, 0, 10, 10], [38, 36, 42, 44]])
    # letterbox: minus the pad, divided by the scale, clipped to the original (w, h)
    back = tasks.yolo_detections(head, conf=0.25, iou=0.45, scale=2.0, pad=(4, 0), clip=(18, 20))
    np.testing.assert_allclose(back.boxes, [[0, 0, 3, 5], [17, 18, 18, 20]])
    assert len(tasks.yolo_detections(head, conf=0.95, iou=0.45).scores) == 0


def _one_hot_distribution(cells, sides, bins=8):
    """[1, cells, 4·bins] logits with all the mass of side j of every cell on bin sides[j]."""
    logits = np.full((1, cells, 4, bins), -50.0, np.float32)
    for j, k in enumerate(sides):
        logits[0, :, j, k] = 50.0
    return logits.reshape(1, cells, 4 * bins)


def test_picodet_centres_distances_and_feature_map_sizes(tasks):
    # input 16 × 16: stride 8 has 2 × 2 cells, stride 16 one cell
    dists = [_one_hot_distribution(4, (1, 0, 2, 1)), _one_hot_distribution(1, (0, 0, 0, 0))]
    scores = [np.zeros((1, 4, 3), np.float32), np.zeros((1, 1, 3), np.float32)]
    scores[0][0, 1, 2] = 0.9  # cell row 0, col 1 of stride 8: centre (12, 4)
    boxes, probs = tasks.picodet_candidates(scores, dists, (16, 16), strides=(8, 16))
    assert boxes.shape == (5, 4) and probs.shape == (5, 3)
    np.testing.assert_allclose(boxes[0], [12 - 8, 4 - 0, 12 + 16, 4 + 8], atol=1e-4)  # best cell first
    np.testing.assert_allclose(boxes[4], [8, 8, 8, 8], atol=1e-4)  # stride 16, zero distances
    # a 20 × 16 input has ⌈20/8⌉ × ⌈16/8⌉ = 6 cells at stride 8 (rapid_layout's np.arange of 2.5)
    six = tasks.picodet_candidates([np.zeros((1, 6, 3))], [_one_hot_distribution(6, (0, 0, 0, 0))], (20, 16),
                                   strides=(8,))[0]
    assert sorted(map(tuple, six[:, :2].tolist())) == sorted((x, y) for y in (4, 12, 20) for x in (4, 12))
    # per-class NMS, clipped to the input, scaled to an original of 32 × 32
    found = tasks.picodet_detections(scores, dists, (16, 16), (32, 32), conf=0.5, iou=0.5, strides=(8, 16))
    assert found.classes.tolist() == [2]
    np.testing.assert_allclose(found.boxes, [[8, 8, 32, 24]], atol=1e-3)


def test_matching_is_same_class_iou_half_one_to_one(tasks):
    ref = dets(tasks, [[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0.9, 0.8, 0.7], [0, 1, 2])
    got = dets(tasks, [[0, 0, 10, 10],      # kept
                       [20, 0, 30, 10],     # right box, wrong class
                       [42, 0, 52, 10]],    # IoU 80/120 = 0.67: kept
               [0.5, 0.9, 0.6], [0, 0, 2])
    assert tasks.matched(ref, got) == 2
    assert tasks.kept_share(ref, got) == pytest.approx(2 / 3)
    shifted = dets(tasks, [[5, 0, 15, 10]], [0.9], [0])  # IoU 50/150 = 0.33 with the first
    assert tasks.kept_share(ref, shifted) == 0.0
    twins = dets(tasks, [[0, 0, 10, 10], [0, 0, 10, 10]], [0.9, 0.8], [0, 0])
    assert tasks.matched(twins, ref) == 1  # one candidate box serves one reference box
    empty = tasks.Detections(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64))
    assert tasks.kept_share(empty, got) == 1.0 and tasks.kept_share(ref, empty) == 0.0


def test_detection_metric_worst_mean_spurious_and_truth(tasks):
    ref = [dets(tasks, [[0, 0, 10, 10], [20, 0, 30, 10]], [0.9, 0.8], [0, 1]),
           dets(tasks, [[0, 0, 10, 10]], [0.9], [3])]
    variant = [dets(tasks, [[0, 0, 10, 10], [60, 60, 70, 70]], [0.9, 0.8], [0, 1]),  # keeps 1 of 2, 1 spurious
               dets(tasks, [[0, 0, 10, 10]], [0.4], [3])]                           # keeps 1 of 1
    decode = lambda outputs, i: outputs["dets"]  # noqa: E731 - the samples carry their detections
    truth = lambda detections: float(np.mean([0 in d.classes.tolist() for d in detections]))  # noqa: E731
    hook = tasks.detection_metric(decode, truth)
    result = hook([{"dets": d} for d in ref], [{"dets": d} for d in variant])
    assert result["kept_mean"] == pytest.approx(0.75) and result["agreement"] == pytest.approx(0.75)
    assert result["kept_worst"] == pytest.approx(0.5)
    assert result["spurious_mean"] == pytest.approx(0.25)
    assert (result["detections_original"], result["detections"]) == (3, 3)
    assert result["score"] == result["score_original"] == 0.5
    same = tasks.detection_metric(decode)([{"dets": d} for d in ref], [{"dets": d} for d in ref])
    assert same["agreement"] == same["kept_worst"] == same["score"] == 1.0 and same["spurious_mean"] == 0.0


def test_objects_found_counts_classes_and_blocks(tasks):
    labels = [{"classes": (0, 15)}, {"blocks": [(9, (0, 0, 100, 20)), (6, (0, 40, 100, 140))]}]
    found = [dets(tasks, [[0, 0, 5, 5]], [0.9], [15]),
             dets(tasks, [[0, 2, 100, 22], [0, 40, 100, 140]], [0.9, 0.9], [9, 8])]  # text found, figure as table
    assert tasks.objects_found(labels)(found) == pytest.approx(2 / 4)


def test_letterbox_geometry_round_trips_through_the_yolo_decode(tasks):
    """A box drawn on a 451×300 photo, letterboxed by ``inputs.letterbox`` to 640, found at its
    letterboxed place by a head, comes back at the drawn pixels; the padding is grey 114."""
    inputs = importlib.import_module("inputs")  # the ``tasks`` fixture has benchmarks/ on sys.path
    img = np.zeros((300, 451, 3), np.uint8)
    canvas, scale, pad_x, pad_y = inputs.letterbox(img, 640)
    assert canvas.shape == (640, 640, 3) and scale == pytest.approx(640 / 451)
    assert (pad_x, pad_y) == (0, (640 - int(300 * 640 / 451)) // 2)
    assert np.all(canvas[:pad_y] == 114) and np.all(canvas[pad_y + 2:640 - pad_y - 2] == 0)
    x0, y0, x1, y1 = 100, 50, 200, 250
    cx, cy = (x0 + x1) / 2 * scale + pad_x, (y0 + y1) / 2 * scale + pad_y
    head = _yolo_head([(cx, cy, (x1 - x0) * scale, (y1 - y0) * scale, 0.1, 0.7)])
    found = tasks.yolo_detections(head, 0.25, 0.45, scale, (pad_x, pad_y), clip=(451, 300))
    np.testing.assert_allclose(found.boxes, [[x0, y0, x1, y1]], atol=1e-3)
