"""Real excerpts of the Debian sources, and helpers to lay them out as an unpacked package cache.

The lines below are copied verbatim from trans-de-en 1.9-6 and LibreOffice 7.4.7 (Debian bookworm),
so the readers are tested against the formats as they really are.
"""

from __future__ import annotations

import struct
from pathlib import Path

from model.translation import debian

# trans-de-en: /usr/share/trans/de-en (header, a line without examples, two with examples)
DING_LINES = [
    "# Version :: devel 2023-01-30",
    "Aalsuppe {f} [cook.] | Aalsuppen {pl} :: eel soup | eel soups",
    (
        "Erinnerung {f} (an etw.) | Erinnerungen {pl} | Soweit ich mich erinnern kann, bin ich ihm nur einmal begegnet. "
        "| An meinen neunten Geburtstag kann ich mich nur ganz dunkel erinnern. | Ich habe keine Erinnerung an das "
        "Geschehen. [geh.] | Sie hat ein phänomenales Gedächtnis.; Sie erinnert sich (wirklich) an alles. :: recollection; "
        "remembrance; memory; recall (of sth.) | recollections; remembrances; memories; recalls | To the best of my "
        "recollection, I only met him once. | I’ve only a vague recollection of my ninth birthday. | I have no "
        "recollection of what happened. (formal.) | She has total recall."
    ),
    (
        "Abmachung {f}; Handel {m}; Deal {m} [ugs.] | Abmachungen {pl}; Deals {pl} | Hast du vergessen, was wir "
        "abgemacht/ausgemacht [Ös.] haben? | Auf so einen Handel würde ich mich nie einlassen. | Wir haben es mit unserem "
        "Urlaub gut / schlecht getroffen. | Am 17. September 1806 war der Krieg gegen Frankreich beschlossene Sache. :: "
        "deal | deals | Are you forgetting our deal? | I would never agree to such a deal. | We got a good/bad deal on our "
        "holiday. | On 17 September 1806, the war against France was a done deal."
    ),
]
DING_PAIRS = [  # (english, german) as ding_example_pairs returns them, in file order
    (
        "To the best of my recollection, I only met him once.",
        "Soweit ich mich erinnern kann, bin ich ihm nur einmal begegnet.",
    ),
    (
        "I’ve only a vague recollection of my ninth birthday.",
        "An meinen neunten Geburtstag kann ich mich nur ganz dunkel erinnern.",
    ),
    ("I have no recollection of what happened.", "Ich habe keine Erinnerung an das Geschehen."),
    ("She has total recall.", "Sie hat ein phänomenales Gedächtnis."),
    ("Are you forgetting our deal?", "Hast du vergessen, was wir abgemacht haben?"),
    ("I would never agree to such a deal.", "Auf so einen Handel würde ich mich nie einlassen."),
    (
        "On 17 September 1806, the war against France was a done deal.",
        "Am 17. September 1806 war der Krieg gegen Frankreich beschlossene Sache.",
    ),
]

# libreoffice-help-*: paragraphs of text/shared/01/01010000.html, shared/02/12090101.html, sbasic/shared/03103200.html
# and (first three sentences) scalc/guide/datapilot_createtable.html; "Only in English." stands for an untranslated id.
_PAGE = '<!DOCTYPE html>\n<html lang="{lang}"><head><title>x</title></head><body><div id="DisplayArea">\n{body}\n</div></body></html>\n'
HELP_EN = _PAGE.format(
    lang="en-US",
    body="""\
<h1 id="hd_id3154788" dir="auto">New</h1>
  <p id="par_id3145669" class="paragraph" dir="auto"><span class="avis">Creates a new LibreOffice document.</span></p>
<p id="par_id3154894" class="paragraph" dir="auto">Key <span id="swlnsystextshared0000000401xml_1" class="switchinline"><span hidden="true" id="MACtextshared0000000401xml_1" class="MAC"><span class="keycode">Command</span></span><span hidden="true" id="defaulttextshared0000000401xml_1"><span class="keycode">Ctrl</span></span></span><span class="keycode">+N</span></p>
<p id="par_id3153528" class="paragraph" dir="auto"><span class="avis">If you want to create a document from a template, choose <span class="emph">New - Templates</span>.</span></p>
<p id="par_id3154811" class="paragraphintable" dir="auto">Not equal (&lt; &gt;)</p>
<p id="par_id3147242" class="paragraph" dir="auto">Defines the default lower boundary for arrays as 0 or 1.</p>
<p id="par_id3147573" class="code" dir="auto">Option Base { 0 | 1}</p>
<p id="par_id3147264" class="paragraph" dir="auto">Choose <span class="menuitem">Insert - Pivot Table</span>. The <span class="emph">Select Source</span> dialog appears. Choose <span class="emph">Current selection</span> and confirm with <span class="emph">OK</span>.</p>
<p id="par_id3150440" class="paragraph" dir="auto">Only in English.</p>""",
)
HELP_DE = _PAGE.format(
    lang="de",
    body="""\
<h1 id="hd_id3154788" dir="auto">Neu</h1>
  <p id="par_id3145669" class="paragraph" dir="auto"><span class="avis">Erstellt ein neues LibreOffice-Dokument.</span></p>
<p id="par_id3154894" class="paragraph" dir="auto"><span id="swlnsystextshared0000000401xml_1" class="switchinline"><span hidden="true" id="MACtextshared0000000401xml_1" class="MAC"><span class="keycode">Befehl</span></span><span hidden="true" id="defaulttextshared0000000401xml_1"><span class="keycode">Strg</span></span></span><span class="keycode">+N</span></p>
<p id="par_id3153528" class="paragraph" dir="auto"><span class="avis">Um ein neues Dokument auf Grundlage einer Dokumentvorlage zu erstellen, wählen Sie <span class="emph">Neu – Vorlagen…</span>.</span></p>
<p id="par_id3154811" class="paragraphintable" dir="auto">Ungleich (&lt; &gt;)</p>
<p id="par_id3147242" class="paragraph" dir="auto">Legt die Standard-Untergrenze für Arrays als 0 beziehungsweise 1 fest.</p>
<p id="par_id3147573" class="code" dir="auto">Option Base { 0 | 1}</p>
<p id="par_id3147264" class="paragraph" dir="auto">Wählen Sie <span class="menuitem">Einfügen – Pivot-Tabelle…</span>. Der Dialog <span class="emph">Quelle auswählen</span> wird geöffnet. Wählen Sie <span class="emph">Aktuelle Auswahl</span> und bestätigen Sie mit <span class="emph">OK</span>.</p>""",
)
HELP_PAIRS = [  # help_paragraph_pairs(HELP_EN, HELP_DE): the code paragraph and the English-only one are left out
    ("New", "Neu"),
    ("Creates a new LibreOffice document.", "Erstellt ein neues LibreOffice-Dokument."),
    ("Key Ctrl+N", "Strg+N"),
    (
        "If you want to create a document from a template, choose New - Templates.",
        "Um ein neues Dokument auf Grundlage einer Dokumentvorlage zu erstellen, wählen Sie Neu – Vorlagen….",
    ),
    ("Not equal (< >)", "Ungleich (< >)"),
    (
        "Defines the default lower boundary for arrays as 0 or 1.",
        "Legt die Standard-Untergrenze für Arrays als 0 beziehungsweise 1 fest.",
    ),
    (
        "Choose Insert - Pivot Table. The Select Source dialog appears. Choose Current selection and confirm with OK.",
        "Wählen Sie Einfügen – Pivot-Tabelle…. Der Dialog Quelle auswählen wird geöffnet. Wählen Sie Aktuelle Auswahl und bestätigen Sie mit OK.",
    ),
]

# libreoffice-l10n-de: program/resource/de/LC_MESSAGES/{sc,sd,basctl,cui,sfx}.mo, as (msgid, msgstr) entries
UI_ENTRIES = [
    ("", "Project-Id-Version: PACKAGE VERSION\nContent-Type: text/plain; charset=UTF-8\n"),
    ("SCSTR_TOTAL\x04One result found\x00%1 results found", "1 Ergebnis gefunden\x00%1 Ergebnisse gefunden"),
    ("publishingdialog|resolution3Radiobutton\x04High (_1024 × 768 pixels)", "Hoch (_1024 x 768 px)"),
    ("fldfuncpage|down\x04Move Do_wn", "Nach _unten verschieben"),
    ("notebookbar_impress_compact|TableLabel\x04~Table", "~Tabelle"),
    ("RID_BASIC_START\x04$(ARG1) not allowed outside a procedure.", "$(ARG1) außerhalb einer Prozedur unzulässig."),
    ("RID_STRLIST_FUNCTION_NAMES\x04LN", "LN"),
    ("RID_SVXSTR_UNTRANSLATED\x04Not yet translated", ""),
    (
        "STR_RESTART\x04You will have to restart the program after this edit.\nContinue?",
        "Sie müssen nach dieser Änderung das Programm neu starten.\nFortfahren?",
    ),
]
UI_PAIRS = [  # ui_message_pairs(UI_ENTRIES): context dropped, both plural forms, header and untranslated skipped
    ("One result found", "1 Ergebnis gefunden"),
    ("%1 results found", "%1 Ergebnisse gefunden"),
    ("High (_1024 × 768 pixels)", "Hoch (_1024 x 768 px)"),
    ("Move Do_wn", "Nach _unten verschieben"),
    ("~Table", "~Tabelle"),
    ("$(ARG1) not allowed outside a procedure.", "$(ARG1) außerhalb einer Prozedur unzulässig."),
    ("LN", "LN"),
    (
        "You will have to restart the program after this edit.\nContinue?",
        "Sie müssen nach dieser Änderung das Programm neu starten.\nFortfahren?",
    ),
]

# wesnoth-1.16-data (wesnoth-help.mo, wesnoth-editor.mo) and wesnoth-1.16-httt 1:1.16.9-1, verbatim
WESNOTH_ENTRIES = [
    ("<header>text='Multiplayer and undo'</header>", "<header>text='Mehrspieler und die Rückgängig-Funktion'</header>"),
    ("theme^Editor", "Editor"),
    ("Could not save the map: $msg", "Die Karte konnte nicht gespeichert werden: $msg"),
    ("Should $unit.name| attempt to pick up the armor?", "Soll $unit.name| versuchen, die Rüstung aufzuheben?"),
    (
        "Delfador! My old tormentor! Treason! Men! Seize them! Kill them! Kill them all!",
        "Delfador! Mein alter Erzfeind! Verrat! Männer, ergreift sie. Tötet sie. Tötet sie alle!",
    ),
    ("Defeat all enemy leaders", "Besiegt alle gegnerischen Anführer"),
]
WESNOTH_PAIRS = [  # game_message_pairs(WESNOTH_ENTRIES), in catalog order; tags go later, in cleaning
    ("<header>Multiplayer and undo</header>", "<header>Mehrspieler und die Rückgängig-Funktion</header>"),
    ("Defeat all enemy leaders", "Besiegt alle gegnerischen Anführer"),
    (
        "Delfador! My old tormentor! Treason! Men! Seize them! Kill them! Kill them all!",
        "Delfador! Mein alter Erzfeind! Verrat! Männer, ergreift sie. Tötet sie. Tötet sie alle!",
    ),
    ("Editor", "Editor"),
]

# freeciv-data 3.0.6-1+deb12u1 (freeciv-core.mo, freeciv-nations.mo), verbatim
FREECIV_ENTRIES = [
    ("?improvement:You bought %s in %s.", "Sie haben %s in %s gekauft."),
    ("Your leader name", "Name Ihres Staatsoberhaupts"),
    ("_Keep current soundset", "_Derzeitiges Sound-Set beibehalten"),
    ("?plural:Frisians", "Friesen"),
]
FREECIV_PAIRS = [  # game_message_pairs(FREECIV_ENTRIES): context hints dropped, the printf string left out
    ("Your leader name", "Name Ihres Staatsoberhaupts"),
    ("_Keep current soundset", "_Derzeitiges Sound-Set beibehalten"),
    ("Frisians", "Friesen"),
]

# cataclysm-dda-data 0.F-3-9 (cataclysm-dda.mo), verbatim
CATACLYSM_ENTRIES = [
    ("How did you even get here if you're so sick?", "Wie bist du überhaupt hierher gekommen, wenn du so krank bist?"),
    (
        "* This food looks as <good>fresh</good> as it can be.",
        "* Dieses Lebensmittel sieht so <good>frisch</good> aus, wie es nur sein kann.",
    ),
    ("<color_red>Very dangerous.</color>", "<color_red>Sehr gefährlich.</color>"),
    ("<npcname> calms down.", "<npcname> beruhigt sich."),
    ("<npcname> drops the %s.", "<npcname> lässt %s fallen."),
    ("rock\x00rocks", "Stein\x00Steine"),
    ("profession_male\x04Beekeeper", "Imker"),
]
CATACLYSM_PAIRS = [  # placeholder_free_pairs(CATACLYSM_ENTRIES), in catalog order; tags go later, in cleaning
    ("* This food looks as <good>fresh</good> as it can be.", CATACLYSM_ENTRIES[1][1]),
    ("<color_red>Very dangerous.</color>", "<color_red>Sehr gefährlich.</color>"),
    ("How did you even get here if you're so sick?", CATACLYSM_ENTRIES[0][1]),
    ("Beekeeper", "Imker"),
    ("rock", "Stein"),
    ("rocks", "Steine"),
]

# widelands-data 2:1.1-3 (widelands.mo, tribes_encyclopedia.mo), verbatim
WIDELANDS_ENTRIES = [
    ("atlanteans_worker\x04Bakes bread for workers.", "Bäckt Brot für Arbeiter."),
    ("barbarians_building\x04Captain Thanlas the Elder,<br>Explorer", "Kapitän Thanlas der Ältere,<br>Entdecker"),
    ("%1% × %2%", "%1% × %2%"),
    (
        "Server has crashed and performed an emergency save.",
        "Der Server ist abgestürzt und hat eine Notfallspeicherung durchgeführt.",
    ),
    (
        "Wrong use, should be: /kick <name> <reason>",
        "Falsche Verwendung. Der Befehl sollte „/kick <Name> <Grund>“ sein",
    ),
]
WIDELANDS_PAIRS = [  # placeholder_free_pairs(WIDELANDS_ENTRIES): "%1%" and "<name>" strings left out
    ("Server has crashed and performed an emergency save.", WIDELANDS_ENTRIES[3][1]),
    ("Bakes bread for workers.", "Bäckt Brot für Arbeiter."),
    ("Captain Thanlas the Elder,<br>Explorer", "Kapitän Thanlas der Ältere,<br>Entdecker"),
]

# naev-data 0.8.2-1 (dat/gettext/de/LC_MESSAGES/naev.mo), verbatim: "\a" + letter switches the colour
NAEV_ENTRIES = [
    ("\aoThe ship has no fuel.", "\aoDas Schiff hat keinen Treibstoff."),
    ("\agEscorts: \a0Holding position.", "\agGeleit: \a0Stellung halten."),
    (
        '"Ah, you\'re busy, eh? Oh well. Let me know if you change your mind, OK?"',
        "„Ah, du bist beschäftigt, eh? Ach so. Lass mich wissen, wenn du deine Meinung änderst, OK?“",
    ),
    ("\a%c%s\a0 is hailing you.", "\a%c%s\a0 funkt dich an."),
    ("Menu|\x04Credits", "Mitwirkende"),
]
NAEV_PAIRS = [  # naev_pairs(NAEV_ENTRIES), in catalog order: colour codes gone, the printf string left out
    ("Escorts: Holding position.", "Geleit: Stellung halten."),
    ("The ship has no fuel.", "Das Schiff hat keinen Treibstoff."),
    (NAEV_ENTRIES[2][0], NAEV_ENTRIES[2][1]),
    ("Credits", "Mitwirkende"),
]

# freedroidrpg-data 1.0-1 (freedroidrpg-dialogs.mo, freedroidrpg.mo), verbatim
FREEDROID_ENTRIES = [
    ("That's way too expensive.", "Das ist viel zu teuer."),
    (
        "Don't come back without the [b]Tachyon Condensator[/b].",
        "Komm nicht ohne den [b]Tachionen-Kondensator[/b] zurück.",
    ),
    (
        "Prospective clients are welcome to make appointments from [b]15:00-17:00 Fridays[/b].",
        "Potenzielle Kunden sind herzlich eingeladen, Termine [b]Freitags von 15:00 bis 17:00 Uhr[/ b] zu machen.",
    ),
    ("A [b]%s[/b] jumps out in front of you!", "Ein/e [b]%s[/b] stößt mit dir zusammen!"),
    (
        "Choose a game act\n[r]Warning: Unsaved changes will be lost[n]",
        "Wähle ein Kapitel des Spiels\n[r]Warnung: Ungespeicherte Änderungen gehen verloren[n]",
    ),
]
FREEDROID_PAIRS = [  # freedroid_pairs(FREEDROID_ENTRIES): bold and colour codes gone, the printf string left out
    (
        "Choose a game act\nWarning: Unsaved changes will be lost",
        "Wähle ein Kapitel des Spiels\nWarnung: Ungespeicherte Änderungen gehen verloren",
    ),
    ("Don't come back without the Tachyon Condensator.", "Komm nicht ohne den Tachionen-Kondensator zurück."),
    (
        "Prospective clients are welcome to make appointments from 15:00-17:00 Fridays.",
        "Potenzielle Kunden sind herzlich eingeladen, Termine Freitags von 15:00 bis 17:00 Uhr zu machen.",
    ),
    ("That's way too expensive.", "Das ist viel zu teuer."),
]

# freedink-data 1.08.20190120-2 (dink/l10n/de/LC_MESSAGES/dink.mo), verbatim
FREEDINK_ENTRIES = [
    (
        '"You are injured!  It will cost $&amount gold to heal you."',
        '"Du bist verletzt! Es wird $&amount Goldstücke kosten dich zu heilen."',
    ),
    (
        '"Hello, friend.  I will teach Hellfire magic for $1500 gold."',
        '"Hallo Freund. Ich werde dir die Höllenfeuer-Magie für 1500 Goldstücke beibringen."',
    ),
    (
        "It's your father isn't it?  Does he do anything to you?",
        "Es ist dein Vater, oder? Hat er dir irgendwas angetan?",
    ),
    ("Button 1 - &buttoninfo", "Knopf 1 - &buttoninfo"),
]
FREEDINK_PAIRS = [  # freedink_pairs(FREEDINK_ENTRIES): DinkC variables (&amount) left out whole
    (FREEDINK_ENTRIES[1][0], FREEDINK_ENTRIES[1][1]),
    (FREEDINK_ENTRIES[2][0], FREEDINK_ENTRIES[2][1]),
]

# tuxpaint-stamps-default 2022.06.04-1: stamps/animals/marsupials/kangaroo.txt (its first lines)
STAMP_KANGAROO = """A red kangaroo.
ach.utf8=Kangaru ma kwar.
af.utf8='n Rooi kangeroe
da.utf8=En rød kænguru.
de.utf8=Ein rotes Riesenkänguru.
el.utf8=Κόκκινο καγκουρό.
en_AU.utf8=A red kangaroo.
"""


def build_mo(entries: list[tuple[str, str]]) -> bytes:
    """A little-endian GNU ``.mo`` file, as msgfmt writes it (entries sorted by msgid, no hash table)."""
    entries = sorted(entries)
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    header = 7 * 4
    originals, translations = header, header + 8 * len(entries)
    offset = translations + 8 * len(entries)
    tables, blob = [b"", b""], b""
    for t, strings in enumerate((ids, strs)):
        for s in strings:
            tables[t] += struct.pack("<2I", len(s), offset + len(blob))
            blob += s + b"\0"
    head = struct.pack("<7I", 0x950412DE, 0, len(entries), originals, translations, 0, offset + len(blob))
    return head + tables[0] + tables[1] + blob


def make_package(cache: Path, name: str, files: dict[str, str | bytes], version: str = "1.0-test") -> None:
    """A package as ``debian.fetch`` leaves it in the cache: unpacked files plus the version marker."""
    root = cache / name
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    (root / debian.MARKER).write_text(version + "\n")
