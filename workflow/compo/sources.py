"""Where the data a config sets by hand comes from: for a raw input (compo.inputs.RawInput) that `compo prefetch`
does not fetch, its download address and the layout its reader expects, one line, written beside the key by
`compo inputs --template`. Looked up by the entry's source (datasets) or kind and format (benchmarks) and the key's
leaf (`path`, `image_root`, `classnames`, ...); the entry's name plays no part, so any config's entries are found.
"""

from __future__ import annotations

from typing import Any

CLIP_BENCHMARK = "github.com/LAION-AI/CLIP_benchmark clip_benchmark/datasets/"
KARPATHY = "cs.stanford.edu/people/karpathy/deepimagesent/ (caption_datasets.zip)"
TORCHVISION = "as torchvision.datasets.{} downloads it under this root"
DOCCI_IMAGES = "storage.googleapis.com/docci/data/docci_images.tar.gz; images/"
SHAREGPT4V_JSON = "huggingface.co/datasets/Lin-Chen/ShareGPT4V; the share-captioner JSON"
BRYSBAERT = "crr.ugent.be/archives/1330 (Brysbaert et al. 2014); the TSV"
KARPATHY_FILES = f"{KARPATHY}; dataset_coco.json / dataset_flickr30k.json"
KARPATHY_IMAGES = "cocodataset.org val2014.zip / Flickr30k's flickr30k-images"
CLASSNAMES = f"{CLIP_BENCHMARK}en_classnames.json; the file"

# (section, source or kind, format or "", key leaf) -> "address; layout"; format "" matches any format
SOURCES: dict[tuple[str, str, str, str], str] = {
    ("datasets", "coco", "", "path"): f"{KARPATHY}; dataset_coco.json",
    ("datasets", "coco", "", "image_root"): "cocodataset.org train2014.zip, val2014.zip; train2014/, val2014/",
    ("datasets", "cc3m", "", "path"): "DreamLIP's README (github.com/zyf0619sjtu/DreamLIP): its CC3M caption CSV",
    ("datasets", "cc3m", "", "image_root"): "img2dataset of the CSV's URLs; its output folder",
    ("datasets", "sharegpt4v", "", "path"): SHAREGPT4V_JSON,
    ("datasets", "sharegpt4v", "", "image_root"): "github.com/ShareGPT4Omni/ShareGPT4V docs/Data.md; coco/, sam/, ...",
    ("datasets", "docci", "", "path"): "storage.googleapis.com/docci/data/docci_descriptions.jsonlines; the file",
    ("datasets", "docci", "", "image_root"): DOCCI_IMAGES,
    ("datasets", "dci", "", "path"): "github.com/facebookresearch/DCI (its download script); densely_captioned_images/",
    ("datasets", "dci", "", "image_root"): "github.com/facebookresearch/DCI (SA-1B photos); photos/",
    ("datasets", "localized-narratives", "", "path"): "google.github.io/localized-narratives; the 4 COCO train jsonl",
    ("datasets", "localized-narratives", "", "image_root"): "cocodataset.org train2017.zip; train2017/",
    ("benchmarks", "sugarcrepe", "", "path"): "github.com/RAIVNLab/sugar-crepe data/; its 7 <subset>.json",
    ("benchmarks", "sugarcrepe_pp", "", "path"): "github.com/Sri-Harsha/scpp data/; its 5 <subset>.json",
    ("benchmarks", "", "", "image_root:val2017"): "cocodataset.org val2017.zip; <id>.jpg",
    ("benchmarks", "aro_relation", "", "path"): "github.com/mertyg/vision-language-models-are-bows (Drive ids in "
                                                "dataset_zoo/aro_datasets.py); visual_genome_relation.json",
    ("benchmarks", "aro_attribution", "", "path"): "github.com/mertyg/vision-language-models-are-bows (Drive ids in "
                                                   "dataset_zoo/aro_datasets.py); visual_genome_attribution.json",
    ("benchmarks", "aro_relation", "", "image_root"): "ARO's vgr_vga_images.zip (Drive "
                                                      "1qaPlrwhGNMrR3a11iopZUT_GPP_LrgP9); its images",
    ("benchmarks", "aro_attribution", "", "image_root"): "ARO's vgr_vga_images.zip (Drive "
                                                         "1qaPlrwhGNMrR3a11iopZUT_GPP_LrgP9); its images",
    ("benchmarks", "aro_order", "", "path"): KARPATHY_FILES,
    ("benchmarks", "aro_order", "", "image_root"): KARPATHY_IMAGES,
    ("benchmarks", "retrieval", "", "path"): KARPATHY_FILES,
    ("benchmarks", "retrieval", "", "image_root"): KARPATHY_IMAGES,
    ("benchmarks", "valse", "", "path"): "github.com/Heidelberg-NLP/VALSE data/; its 11 <piece>.json",
    ("benchmarks", "valse", "", "image_roots"): "the piece's source images as VALSE's README lists them (Visual7W, "
                                                "COCO 2014/2017, SWiG images_512, VisDial v1.0 val)",
    ("benchmarks", "zeroshot", "", "classnames"): CLASSNAMES,
    ("benchmarks", "zeroshot", "", "templates"): f"{CLIP_BENCHMARK}en_zeroshot_classification_templates.json; the file",
    ("benchmarks", "linear_probe", "", "classnames"): CLASSNAMES,
    ("benchmarks", "", "imagefolder", "path"): "image-net.org ILSVRC2012 train / val; one synset folder per class",
    ("benchmarks", "", "cifar10", "path"): "cs.toronto.edu/~kriz/cifar-10-python.tar.gz; cifar-10-batches-py/",
    ("benchmarks", "", "cifar100", "path"): "cs.toronto.edu/~kriz/cifar-100-python.tar.gz; cifar-100-python/",
    ("benchmarks", "", "food101", "path"): TORCHVISION.format("Food101") + ": food-101/",
    ("benchmarks", "", "oxford_pets", "path"): TORCHVISION.format("OxfordIIITPet") + ": oxford-iiit-pet/",
    ("benchmarks", "", "flowers102", "path"): TORCHVISION.format("Flowers102") + ": flowers-102/",
    ("benchmarks", "", "sun397", "path"): "vision.princeton.edu/projects/2010/SUN (SUN397.tar.gz, Partitions.zip); "
                                          "SUN397/ with Partitions/",
    ("benchmarks", "", "stanford_cars", "path"): TORCHVISION.format("StanfordCars") + " (the Kaggle mirror): "
                                                 "stanford_cars/",
    ("benchmarks", "", "dtd", "path"): TORCHVISION.format("DTD") + ": dtd/dtd/",
    ("benchmarks", "", "caltech101", "path"): TORCHVISION.format("Caltech101") + ": caltech101/101_ObjectCategories/",
    ("benchmarks", "", "fgvc_aircraft", "path"): TORCHVISION.format("FGVCAircraft") + ": fgvc-aircraft-2013b/",
    ("benchmarks", "", "coco_multilabel", "path"): "cocodataset.org annotations_trainval2014.zip; annotations/",
    ("benchmarks", "", "coco_multilabel", "image_root"): "cocodataset.org train2014.zip, val2014.zip; train2014/, "
                                                         "val2014/",
    ("benchmarks", "", "wds", "path"): "`clip_benchmark_export_wds --dataset vtab/<task> --split <split>` for each "
                                       "split the entry names (pip install clip_benchmark); <split>/nshards.txt, "
                                       "<split>/0.tar, classnames.txt",
    ("benchmarks", "", "elevater", "path"): "the ELEVATER toolkit's datasets (github.com/Computer-Vision-in-the-Wild/"
                                            "Elevater_Toolkit_IC, vision-datasets download); DATASET.ROOT",
    ("benchmarks", "", "elevater", "dataset_info"): "github.com/Computer-Vision-in-the-Wild/Elevater_Toolkit_IC "
                                                    "vision_benchmark/resources/datasets/vision_datasets.json",
    ("benchmarks", "", "elevater", "classnames"): "github.com/Computer-Vision-in-the-Wild/Elevater_Toolkit_IC "
                                                  "vision_benchmark/datasets/prompts.py",
    ("benchmarks", "", "elevater", "templates"): "github.com/Computer-Vision-in-the-Wild/Elevater_Toolkit_IC "
                                                 "vision_benchmark/datasets/prompts.py",
    ("benchmarks", "", "docci", "path"): "storage.googleapis.com/docci/data/docci_descriptions.jsonlines; its folder",
    ("benchmarks", "", "docci", "image_root"): DOCCI_IMAGES,
    ("benchmarks", "", "dci", "path"): "github.com/facebookresearch/DCI; densely_captioned_images/ with splits.json",
    ("benchmarks", "", "sharegpt4v", "path"): SHAREGPT4V_JSON,
    ("benchmarks", "", "sharegpt4v", "image_root"): "github.com/ShareGPT4Omni/ShareGPT4V docs/Data.md; images",
    ("benchmarks", "", "iiw", "path"): "github.com/google/imageinwords datasets/; IIW-400/data.jsonl, ...",
    ("benchmarks", "", "iiw", "image_root"): "DOCCI's AAR images (storage.googleapis.com/docci); docci_aar/",
    ("benchmarks", "imagecode", "", "path"): "github.com/McGill-NLP/imagecode data/; valid_data.json",
    ("benchmarks", "imagecode", "", "image_root"): "zenodo.org/record/6518944 image-sets.zip; <set>/imgN.jpg",
    ("benchmarks", "vl_checklist", "", "path"): "github.com/om-ai-lab/VL-CheckList; corpus/v1/ and data/",
    ("benchmarks", "vl_checklist", "", "image_roots"): "Visual Genome VG_100K[_2], HAKE, SWiG images_512 "
                                                       "(VL-CheckList's DATA.md); each corpus yaml's IMG_ROOT",
    ("benchmarks", "whatsup", "", "path"): "github.com/amitakamath/whatsup_vlms (Drive folder "
                                           "164q6X9hrvP-QYpi3ioSnfMuyHpG5oRkZ); its six JSONs",
    ("benchmarks", "whatsup", "", "image_root"): "the same Drive folder; controlled_images/, controlled_clevr/, "
                                                 "val2017/, vg_images/",
    ("benchmarks", "svo_probes", "", "image_root"): "the pos_url / neg_url of svo_probes.csv (img2dataset); "
                                                    "<image id>.jpg in an absolute folder of yours",
    ("benchmarks", "crepe", "", "path"): "github.com/RAIVNLab/CREPE data/prod_hard_negatives.zip; "
                                         "prod_hard_negatives/",
    ("benchmarks", "crepe", "", "image_root"): "Visual Genome VG_100K, VG_100K_2; the folder holding both",
    ("benchmarks", "eqben", "", "path"): "github.com/Wangt-CN/EqBen (Drive 1gNR4K2Cv4rbnjVRdHuBV6PuoJ5MlRXnZ); "
                                         "the annotation JSON as `file`",
    ("benchmarks", "eqben", "", "image_root"): "EqBen's image archive (Drive 1e608uhd36ak_v7SnlMVaYcekBc4gBqzn)",
    ("concreteness", "", "", "norms"): BRYSBAERT,
    ("negatives", "", "", "norms"): BRYSBAERT,
}


def source_line(section: str, spec: dict[str, Any], leaf: str, path: str = "") -> str | None:
    """The download address and layout of the key `<section>.<name>.<leaf>` of entry `spec` (leaf
    `image_roots.<piece>` is looked up as `image_roots`), or None when the table has none."""
    kind = str(spec.get("kind") or spec.get("source") or "")
    fmt = str(spec.get("format") or ("imagefolder" if spec.get("kind") in ("zeroshot", "linear_probe") else ""))
    leaf = leaf.split(".")[0]
    if leaf == "image_root" and path.rstrip("/").endswith("val2017"):
        return SOURCES[(section, "", "", "image_root:val2017")]
    for key in ((section, kind, fmt, leaf), (section, kind, "", leaf), (section, "", fmt, leaf),
                (section, "", "", leaf)):
        if key in SOURCES:
            return SOURCES[key]
    return None
