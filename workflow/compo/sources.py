"""Download addresses that more than one reader's declaration names (a dataset source and a benchmark kind reading
the same release). Each kind declares where its own files come from (`Benchmark.downloads`, compo.evaluate.kinds),
each labelled or long-caption format beside its layout (compo.evaluate.files), each dataset source beside its reader
(compo.data.DOWNLOADS); `compo inputs --template` writes them beside the keys a user sets by hand.
A line reads "address; the layout the reader expects". This module imports nothing, so every declaration can.
"""

CLIP_BENCHMARK = "github.com/LAION-AI/CLIP_benchmark clip_benchmark/datasets/"
KARPATHY = "cs.stanford.edu/people/karpathy/deepimagesent/ (caption_datasets.zip)"
KARPATHY_FILES = f"{KARPATHY}; dataset_coco.json / dataset_flickr30k.json"
KARPATHY_IMAGES = "cocodataset.org val2014.zip / Flickr30k's flickr30k-images"
TORCHVISION = "as torchvision.datasets.{} downloads it under this root"
COCO_2014 = "cocodataset.org train2014.zip, val2014.zip; train2014/, val2014/"
COCO_VAL2017 = "cocodataset.org val2017.zip; <id>.jpg"
DOCCI_DESCRIPTIONS = "storage.googleapis.com/docci/data/docci_descriptions.jsonlines"
DOCCI_IMAGES = "storage.googleapis.com/docci/data/docci_images.tar.gz; images/"
SHAREGPT4V_JSON = "huggingface.co/datasets/Lin-Chen/ShareGPT4V; the share-captioner JSON"
DCI = "github.com/facebookresearch/DCI"
BRYSBAERT = "crr.ugent.be/archives/1330 (Brysbaert et al. 2014); the TSV"
CLIP_BENCHMARK_CLASSNAMES = f"{CLIP_BENCHMARK}en_classnames.json; the file"
ARO_FILES = "github.com/mertyg/vision-language-models-are-bows (Drive ids in dataset_zoo/aro_datasets.py); {}"
ARO_IMAGES = "ARO's vgr_vga_images.zip (Drive 1qaPlrwhGNMrR3a11iopZUT_GPP_LrgP9); its images"
WHATSUP_DRIVE = "github.com/amitakamath/whatsup_vlms (Drive folder 164q6X9hrvP-QYpi3ioSnfMuyHpG5oRkZ)"
ELEVATER = "github.com/Computer-Vision-in-the-Wild/Elevater_Toolkit_IC"
YOUR_OWN = "your own files"
