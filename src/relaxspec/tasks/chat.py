"""Chat prompts for a real chat verifier (e.g. SmolLM2-135M-Instruct): unscored, used to distil a
drafter on the verifier's own answers (`training_prompts`) and to measure speed on prompts the drafter
never saw (`HELDOUT`).

Training prompts are made from instruction templates x subjects; no held-out prompt is among them
(tests/test_tasks_chat.py checks it), and no held-out subject is a training subject.
"""

from __future__ import annotations

import random

HELDOUT = [
    "What is the capital of France, and what is it famous for?",
    "Explain how a rainbow forms.",
    "Write a short poem about the ocean at night.",
    "Give three tips for staying focused while studying.",
    "What is the difference between weather and climate?",
    "How does a refrigerator keep food cold?",
    "Describe the water cycle in simple terms.",
    "Why do leaves change color in autumn?",
    "Write a friendly email inviting a colleague to lunch.",
    "What are the main benefits of regular exercise?",
    "Explain what a computer virus is.",
    "How do bees make honey?",
    "Summarize the story of Cinderella in a few sentences.",
    "What should I pack for a weekend camping trip?",
    "Explain why the sky is blue.",
    "What is photosynthesis?",
    "Give me a simple recipe for pancakes.",
    "How can I save money on groceries?",
    "What causes earthquakes?",
    "Describe a typical day in the life of a firefighter.",
]

_TEMPLATES = [
    "Explain {s} to a ten-year-old.",
    "What is {s}?",
    "Give three interesting facts about {s}.",
    "Write a short paragraph about {s}.",
    "What are the advantages and disadvantages of {s}?",
    "How would you describe {s} to someone who has never heard of it?",
    "Write a haiku about {s}.",
    "Why is {s} important?",
    "List five questions a student might ask about {s}, with short answers.",
    "Summarize the history of {s} in a few sentences.",
    "Give me some tips related to {s}.",
    "Write a short story that involves {s}.",
    "What is {s}, and why does it matter?",
    "Explain how {s} works.",
    "Write a short poem about {s}.",
    "Give three tips for someone interested in {s}.",
    "How does {s} affect our daily lives?",
    "Describe {s} in simple terms.",
    "Write a friendly note to a friend about {s}.",
    "What are the main benefits of {s}?",
    "What should a beginner know about {s}?",
    "Describe a typical day for someone who works with {s}.",
    "What are common misconceptions about {s}?",
    "Write a short dialogue between two people discussing {s}.",
    "Explain {s} in one paragraph.",
    "Give me a fun fact about {s}.",
    "Compare {s} with something from everyday life.",
    "How has {s} changed over time?",
    "Write a limerick about {s}.",
    "What would the world be like without {s}?",
    "Teach me the basics of {s} step by step.",
    "What questions do scientists still have about {s}?",
]

# Subjects of the training prompts; none is a subject of a held-out prompt.
_SUBJECTS = [
    "volcanoes", "the moon", "electricity", "gravity", "the human heart", "recycling", "the internet",
    "solar panels", "dinosaurs", "the Roman Empire", "chess", "coffee", "the piano", "penguins",
    "the stock market", "vaccines", "black holes", "the printing press", "bicycles", "yoga",
    "the Amazon rainforest", "glaciers", "democracy", "music theory", "the immune system", "tea",
    "electric cars", "the Great Wall of China", "mathematics", "friendship", "public libraries",
    "sleep", "the Olympic Games", "airplanes", "sharks", "deserts", "cloud computing", "robots",
    "the Renaissance", "gardening", "time management", "bread baking", "the solar system",
    "cats", "dogs", "earth's atmosphere", "trains", "bridges", "photography", "wind energy",
    "ancient Egypt", "mountains", "coral reefs", "social media", "chocolate", "the violin",
    "the printing of books", "magnets", "spiders", "rivers", "the French Revolution", "soccer",
    "meditation", "learning a language", "kindness", "museums", "pizza", "the periodic table",
    "elephants", "snow", "lighthouses", "smartphones", "the brain", "owls", "video games",
    "classical music", "origami", "the desert tortoise", "submarines", "hot air balloons",
    "the Moon landing", "knitting", "jazz", "the Pyramids of Giza", "octopuses", "tigers", "whales",
    "dolphins", "horses", "butterflies", "ants", "frogs", "eagles", "parrots", "wolves", "bats",
    "mushrooms", "cactus plants", "oak trees", "sunflowers", "tomatoes", "rice", "cheese", "ice cream",
    "sushi", "olive oil", "spices", "vegetarian cooking", "table manners", "birthdays", "weddings",
    "board games", "puzzles", "magic tricks", "circuses", "theaters", "movies", "cartoons", "comic books",
    "poetry", "novels", "fairy tales", "myths of ancient Greece", "the Vikings", "the Maya civilization",
    "the Industrial Revolution", "the Silk Road", "medieval castles", "knights", "pirates", "explorers",
    "maps", "compasses", "clocks", "calendars", "the alphabet", "writing systems", "handwriting",
    "public speaking", "job interviews", "teamwork", "leadership", "negotiation", "habits", "motivation",
    "creativity", "curiosity", "patience", "honesty", "gratitude", "happiness", "stress", "laughter",
    "dreams", "memory", "the five senses", "the human skeleton", "muscles", "the lungs", "the liver",
    "blood", "DNA", "genetics", "evolution", "fossils", "cells", "bacteria", "microscopes", "telescopes",
    "satellites", "rockets", "the International Space Station", "Mars", "Jupiter", "Saturn's rings",
    "comets", "stars", "galaxies", "the Big Bang", "light", "sound", "heat", "friction", "energy",
    "batteries", "nuclear power", "hydroelectric dams", "oil and gas", "plastic", "glass", "steel",
    "concrete", "wood", "paper", "cotton", "silk", "wool", "skyscrapers", "tunnels", "roads",
    "traffic lights", "cars", "motorcycles", "ships", "canals", "harbors", "airports", "helicopters",
    "drones", "3D printing", "artificial intelligence", "programming", "databases", "passwords",
    "encryption", "email spam", "search engines", "web browsers", "open source software", "spreadsheets",
    "keyboards", "television", "radio", "the telephone", "newspapers", "advertising", "banks",
    "credit cards", "taxes", "insurance", "small businesses", "farming", "fishing", "beekeeping",
    "forests", "islands", "caves", "waterfalls", "lakes", "swamps", "the Arctic", "Antarctica",
    "tornadoes", "hurricanes", "lightning", "tides", "sand dunes", "rocks and minerals", "diamonds",
    "gold", "volunteering", "neighborhoods", "city parks", "zoos", "aquariums", "hospitals", "nurses",
    "teachers", "pilots", "chefs", "architects", "farmers", "astronauts", "detectives", "librarians",
    "basketball", "tennis", "swimming", "running marathons", "cycling races", "skiing", "surfing",
    "rock climbing", "martial arts", "dance", "painting", "sculpture", "pottery", "calligraphy",
]


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """n distinct training prompts (template x subject), shuffled with `seed`; at most
    len(templates) x len(subjects) of them."""
    pool = [t.format(s=s) for s in _SUBJECTS for t in _TEMPLATES]
    if not 0 < n <= len(pool):
        raise ValueError(f"n must be in 1..{len(pool)}, got {n}")
    random.Random(seed).shuffle(pool)
    return pool[:n]
